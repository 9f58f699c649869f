#!/usr/bin/env python3
"""Walks the registry's hub pages in a real headless Chromium, as a person would, and prints
what the rendered DOM says as one JSON object (the Rust test host/tests/e2e/hub.rs asserts on it).

The browser is driven over the Chrome DevTools Protocol on a pipe (--remote-debugging-pipe:
JSON messages separated by NUL bytes on file descriptors 3 and 4), so nothing beyond Python's
standard library and the Debian chromium (or chromium-headless-shell) package is needed.

Steps: the index (screenshot), a search typed into the box and submitted with Enter
(screenshot), a mouse click on a package's link, its page's DOM (install command, versions,
signature state, README, data, arguments, evaluations) and the Copy button (screenshot); the
same page with JavaScript disabled (the command is still a one-click-selectable block); a
package with a hostile README (no script element, no handler, no javascript: link, no dialog).

usage: hub-browser.py --url http://127.0.0.1:PORT --out DIR --search math
                      --open will/math-python --hostile rlhost/hostile-readme [--chromium PATH]
"""

import argparse
import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time

TIMEOUT_S = 30.0


class Browser:
    """One headless Chromium and one page (a flattened CDP session)."""

    def __init__(self, binary: str, profile: str):
        to_child_r, self.to_child = os.pipe()
        self.from_child, from_child_w = os.pipe()
        # Above any descriptor the child's dup2 onto 3 and 4 could clobber.
        keep_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 10)
        keep_w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 10)
        os.close(to_child_r)
        os.close(from_child_w)

        def wire():
            os.dup2(keep_r, 3)
            os.dup2(keep_w, 4)

        self.proc = subprocess.Popen(
            [
                binary,
                "--headless",
                "--remote-debugging-pipe",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
                "--disable-sync",
                "--mute-audio",
                "--hide-scrollbars",
                "--font-render-hinting=none",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            pass_fds=(3, 4),
            preexec_fn=wire,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(keep_r)
        os.close(keep_w)
        self.buffer = b""
        self.next_id = 0
        self.events = []
        self.dialogs = []
        self.session = None
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call(
            "Target.attachToTarget", {"targetId": target, "flatten": True}
        )["sessionId"]
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False},
        )

    def _read_message(self, deadline: float):
        while b"\0" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no message from the browser in time")
            ready, _, _ = select.select([self.from_child], [], [], left)
            if ready:
                chunk = os.read(self.from_child, 1 << 20)
                if not chunk:
                    raise RuntimeError("the browser closed its pipe")
                self.buffer += chunk
        raw, self.buffer = self.buffer.split(b"\0", 1)
        message = json.loads(raw)
        if message.get("method") == "Page.javascriptDialogOpening":
            # A dialog would block the page: note it, dismiss it.
            self.dialogs.append(message["params"].get("message", ""))
            self._send("Page.handleJavaScriptDialog", {"accept": False})
        return message

    def _send(self, method, params=None):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if self.session:
            message["sessionId"] = self.session
        os.write(self.to_child, json.dumps(message).encode() + b"\0")
        return self.next_id

    def call(self, method, params=None):
        sent = self._send(method, params)
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            message = self._read_message(deadline)
            if message.get("id") == sent:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            if "method" in message:
                self.events.append(message)

    def wait_event(self, method):
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            for i, e in enumerate(self.events):
                if e["method"] == method:
                    return self.events.pop(i)
            message = self._read_message(deadline)
            if "method" in message:
                self.events.append(message)

    def loaded(self, action):
        """Runs `action` (which navigates) and waits for the new page's load event."""
        self.events = [e for e in self.events if e["method"] != "Page.loadEventFired"]
        action()
        self.wait_event("Page.loadEventFired")

    def goto(self, url):
        self.loaded(lambda: self.call("Page.navigate", {"url": url}))

    def js(self, expression):
        result = self.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def click(self, selector):
        """A real mouse click in the middle of the first element matching `selector`."""
        box = self.js(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.call(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": box[0], "y": box[1], "button": "left", "clickCount": 1},
            )

    def press_enter(self):
        for kind in ("keyDown", "keyUp"):
            params = {
                "type": kind,
                "key": "Enter",
                "code": "Enter",
                "windowsVirtualKeyCode": 13,
            }
            if kind == "keyDown":
                params["text"] = "\r"
            self.call("Input.dispatchKeyEvent", params)

    def screenshot(self, path):
        height = self.js("document.documentElement.scrollHeight")
        shot = self.call(
            "Page.captureScreenshot",
            {
                "format": "png",
                "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": 1280, "height": min(height, 3000), "scale": 1},
            },
        )
        with open(path, "wb") as f:
            f.write(base64.b64decode(shot["data"]))
        return os.path.basename(path)

    def close(self):
        try:
            self._send("Browser.close")
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


PACKAGE_FACTS = """(() => {
  const text = s => { const e = document.querySelector(s); return e ? e.innerText.trim() : null; };
  const sig = document.querySelector('#signature .sig');
  const pre = document.querySelector('#install-command');
  const copy = document.querySelector('button.copy');
  return {
    url: location.pathname + location.search,
    title: document.title,
    name: text('#package-name'),
    install: text('#install-command'),
    install_user_select: pre ? getComputedStyle(pre).userSelect : null,
    copy_button_visible: copy ? !copy.hidden : false,
    versions: [...document.querySelectorAll('#versions tr[data-version]')].map(r => ({
      version: r.dataset.version, yanked: r.dataset.yanked === 'true'})),
    signature: sig ? {state: sig.dataset.state, pinned: sig.dataset.pinned === 'true'} : null,
    fingerprint: text('#signer-fingerprint'),
    sha256: text('#shown-sha256'),
    readme_headings: [...document.querySelectorAll('#readme h1, #readme h2')].map(h => h.innerText.trim()),
    datasets: [...document.querySelectorAll('#datasets tr[data-split]')].map(r => ({
      split: r.dataset.split, rows: r.querySelector('.rows').innerText.trim(),
      upstream: (r.querySelector('.upstream') || {innerText: ''}).innerText.trim()})),
    args: [...document.querySelectorAll('#args tr[data-arg]')].map(r => r.dataset.arg),
    capabilities: [...document.querySelectorAll('#capabilities code')].map(c => c.innerText),
    evaluations: [...document.querySelectorAll('#evaluations tr[data-eval]')].map(r => ({
      id: r.dataset.eval, model: r.querySelector('.model').innerText.trim(),
      reward: r.querySelector('.reward').innerText.trim(),
      avg_at_k: r.querySelector('.avg').innerText.trim(),
      pass_at_k: [...r.querySelectorAll('.passk')].map(p => [Number(p.dataset.k), p.innerText.trim()])})),
    stylesheets_loaded: [...document.styleSheets].filter(s => { try { return s.cssRules.length > 0; } catch (_) { return false; } }).length,
  };
})()"""

LIST_FACTS = """(() => ({
  url: location.pathname + location.search,
  title: document.title,
  query: document.querySelector('input[name=q]').value,
  packages: [...document.querySelectorAll('li.package')].map(p => p.dataset.package),
  environments: [...document.querySelectorAll('#environments li.package')].map(p => p.dataset.package),
  rewards: [...document.querySelectorAll('#rewards li.package')].map(p => p.dataset.package),
}))()"""

HOSTILE_FACTS = """(() => {
  const readme = document.querySelector('#readme');
  const all = [...readme.querySelectorAll('*')];
  return {
    url: location.pathname,
    scripts_in_readme: readme.querySelectorAll('script').length,
    scripts_in_page: [...document.scripts].map(s => s.getAttribute('src')),
    handlers: all.flatMap(e => [...e.attributes].filter(a => a.name.startsWith('on')).map(a => e.tagName + '[' + a.name + ']')),
    javascript_links: [...readme.querySelectorAll('a')].map(a => a.getAttribute('href')).filter(h => h && h.replace(/\\s/g, '').toLowerCase().startsWith('javascript:')),
    embedded: readme.querySelectorAll('iframe, object, embed, img, form, style, link, meta, base').length,
    shown_as_text: readme.innerText.includes('<script>'),
    pwned: typeof window.__pwned !== 'undefined',
  };
})()"""


def find_chromium(explicit):
    for candidate in [explicit, os.environ.get("RLHOST_CHROMIUM"), "chromium-headless-shell", "chromium", "chromium-browser", "google-chrome"]:
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--search", default="math")
    ap.add_argument("--open", default="will/math-python")
    ap.add_argument("--hostile", required=True)
    ap.add_argument("--chromium")
    a = ap.parse_args()
    binary = find_chromium(a.chromium)
    if not binary:
        print("hub-browser.py: no chromium found (apt install chromium-headless-shell)", file=sys.stderr)
        return 3
    os.makedirs(a.out, exist_ok=True)
    base = a.url.rstrip("/")
    report = {"chromium": binary, "screenshots": []}
    with tempfile.TemporaryDirectory(prefix="hub-browser-") as profile:
        b = Browser(binary, profile)
        try:
            report["version"] = b.call("Browser.getVersion").get("product")
            b.goto(base + "/")
            report["index"] = b.js(LIST_FACTS)
            report["screenshots"].append(b.screenshot(os.path.join(a.out, "hub-index.png")))

            # Search as a person does: focus the box, type, press Enter.
            b.click("input[name=q]")
            b.call("Input.insertText", {"text": a.search})
            b.loaded(b.press_enter)
            report["search"] = b.js(LIST_FACTS)
            report["screenshots"].append(b.screenshot(os.path.join(a.out, "hub-search.png")))

            # Open the package by clicking its link.
            b.loaded(lambda: b.click(f'li.package[data-package="{a.open}"] a.name'))
            report["package"] = b.js(PACKAGE_FACTS)
            b.call("Browser.grantPermissions", {"permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]})
            b.click("button.copy")
            time.sleep(0.3)
            report["copy"] = b.js(
                "({selection: window.getSelection().toString().trim(),"
                " state: document.querySelector('button.copy').dataset.state || null})"
            )
            report["screenshots"].append(b.screenshot(os.path.join(a.out, "hub-package.png")))

            # Without JavaScript: no button, the command still selectable in one click.
            b.call("Emulation.setScriptExecutionDisabled", {"value": True})
            b.goto(base + "/" + a.open)
            report["no_js"] = b.js(PACKAGE_FACTS)
            b.call("Emulation.setScriptExecutionDisabled", {"value": False})

            # A README written to attack the page.
            b.goto(base + "/" + a.hostile)
            time.sleep(0.5)
            report["hostile"] = b.js(HOSTILE_FACTS)
            report["screenshots"].append(b.screenshot(os.path.join(a.out, "hub-hostile.png")))
            report["dialogs"] = b.dialogs
        finally:
            b.close()
    json.dump(report, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
