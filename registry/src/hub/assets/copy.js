// The install command's Copy button. Without JavaScript the button stays hidden and the command
// is a code block that one click selects whole (CSS user-select: all).
document.addEventListener("DOMContentLoaded", () => {
  for (const button of document.querySelectorAll("button.copy[data-copy]")) {
    const block = document.getElementById(button.dataset.copy);
    if (!block) continue;
    button.hidden = false;
    button.addEventListener("click", async () => {
      const text = block.innerText.trim();
      const range = document.createRange();
      range.selectNodeContents(block);
      const selection = window.getSelection();
      selection.removeAllRanges();
      selection.addRange(range);
      let copied = false;
      try {
        await navigator.clipboard.writeText(text);
        copied = true;
      } catch (_) {
        copied = document.execCommand && document.execCommand("copy");
      }
      button.textContent = copied ? "Copied" : "Selected: press Ctrl+C";
      button.dataset.state = copied ? "copied" : "selected";
    });
  }
});
