//! Plugin READMEs as safe HTML. The renderer never passes HTML through: raw HTML blocks and
//! inline tags in the Markdown are shown as text, every text is escaped, links keep only
//! `http:`, `https:`, `mailto:` and relative targets (a `javascript:` or `data:` link becomes its
//! text), and images become links (a page loads nothing from elsewhere). What comes out is
//! CommonMark's own tags with escaped attributes, nothing a README's author chose.

use pulldown_cmark::{Alignment, Event, LinkType, Options, Parser, Tag, TagEnd};

/// Whether a link target is safe to follow: an `http(s)`/`mailto` URL or a relative one.
/// Browsers ignore ASCII tabs and newlines inside schemes (`java\tscript:`), so they are
/// removed before the scheme is read.
pub fn safe_url(url: &str) -> bool {
    let cleaned: String = url
        .chars()
        .filter(|c| !c.is_ascii_whitespace() && !c.is_ascii_control())
        .collect::<String>()
        .to_ascii_lowercase();
    let scheme_end = cleaned.find(':');
    let path_start = cleaned.find(['/', '?', '#']);
    match (scheme_end, path_start) {
        // A colon before any `/`, `?` or `#`: a scheme.
        (Some(colon), p) if p.is_none_or(|p| colon < p) => {
            matches!(&cleaned[..colon], "http" | "https" | "mailto")
        }
        _ => true,
    }
}

/// Renders `markdown` (GitHub-flavoured tables, strikethrough and task lists) to inert HTML.
pub fn to_safe_html(markdown: &str) -> String {
    let options =
        Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TASKLISTS;
    // For each open link or image: whether it was kept (its end tag is kept with it).
    let mut open: Vec<bool> = Vec::new();
    let events = Parser::new_ext(markdown, options).filter_map(|event| match event {
        Event::Html(text) | Event::InlineHtml(text) => Some(Event::Text(text)),
        // Column alignment is written as inline `style` attributes, which the pages' CSP
        // forbids (and the browser would log): tables are left-aligned.
        Event::Start(Tag::Table(columns)) => Some(Event::Start(Tag::Table(
            columns.iter().map(|_| Alignment::None).collect(),
        ))),
        // Images become links (a page loads nothing from elsewhere); either is kept only with a
        // safe target.
        Event::Start(
            Tag::Link {
                dest_url,
                title,
                id,
                ..
            }
            | Tag::Image {
                dest_url,
                title,
                id,
                ..
            },
        ) => {
            let keep = safe_url(&dest_url);
            open.push(keep);
            keep.then_some(Event::Start(Tag::Link {
                link_type: LinkType::Inline,
                dest_url,
                title,
                id,
            }))
        }
        Event::End(TagEnd::Link) | Event::End(TagEnd::Image) => open
            .pop()
            .unwrap_or(false)
            .then_some(Event::End(TagEnd::Link)),
        // Headings' `{#id .class}` attributes are escaped by the writer; keep them.
        other => Some(other),
    });
    let mut html = String::with_capacity(markdown.len() * 3 / 2);
    pulldown_cmark::html::push_html(&mut html, events);
    html
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_markdown_is_inert() {
        let hostile = "# Title\n\n<script>alert(1)</script>\n\n\
            Text <img src=x onerror=alert(2)> and <a href=\"javascript:alert(3)\" onclick=\"alert(4)\">a</a>.\n\n\
            [click](javascript:alert(5)) [tab](java\tscript:alert(6)) [entity](jav&#x61;script:alert(7)) \
            [data](data:text/html,<script>alert(8)</script>) ![pic](https://evil.example/x.png) \
            [ok](https://example.org/a?b=1) [rel](docs/x.md) [mail](mailto:a@b.c)\n\n\
            <iframe src=\"https://evil.example\"></iframe>\n\n```html\n<script>alert(9)</script>\n```\n";
        let html = to_safe_html(hostile);
        // Every tag in the output is one of CommonMark's, with only the attributes it writes
        // (text never holds a raw `<`: it is escaped).
        let allowed = [
            "h1",
            "p",
            "a",
            "pre",
            "code",
            "em",
            "strong",
            "ul",
            "ol",
            "li",
            "table",
            "thead",
            "tbody",
            "tr",
            "th",
            "td",
            "del",
            "input",
            "blockquote",
            "hr",
            "br",
        ];
        for tag in html.split('<').skip(1).map(|t| &t[..t.find('>').unwrap()]) {
            let tag = tag.trim_start_matches('/');
            let name = tag.split([' ', '/']).next().unwrap();
            assert!(allowed.contains(&name), "<{tag}> in {html}");
            for attr in tag.split(' ').skip(1).filter(|a| !a.is_empty()) {
                let key = attr.split('=').next().unwrap();
                assert!(
                    ["href", "title", "class", "type", "checked", "disabled"].contains(&key),
                    "attribute {attr} in <{tag}>"
                );
            }
            assert!(!tag.to_lowercase().contains("href=\"javascript"), "{tag}");
            assert!(!tag.to_lowercase().contains("href=\"data:"), "{tag}");
        }
        assert!(
            html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{html}"
        );
        assert!(
            html.contains("<a href=\"https://example.org/a?b=1\">ok</a>"),
            "{html}"
        );
        assert!(html.contains("<a href=\"docs/x.md\">rel</a>"), "{html}");
        assert!(html.contains("<a href=\"mailto:a@b.c\">mail</a>"), "{html}");
        assert!(
            html.contains("<a href=\"https://evil.example/x.png\">pic</a>"),
            "images become links: {html}"
        );
        assert!(html.contains(">click") && html.contains("entity"), "{html}");
        assert!(html.contains("<h1>Title</h1>"), "{html}");
    }

    #[test]
    fn schemes_are_read_as_browsers_read_them() {
        for ok in [
            "https://x",
            "http://x",
            "MAILTO:a@b",
            "x.md",
            "#anchor",
            "/a:b",
            "?q=a:b",
            "//host/p",
        ] {
            assert!(safe_url(ok), "{ok}");
        }
        for bad in [
            "javascript:x",
            " JavaScript:x",
            "java\nscript:x",
            "data:text/html,x",
            "vbscript:x",
            "file:///etc/passwd",
        ] {
            assert!(!safe_url(bad), "{bad}");
        }
    }

    #[test]
    fn tables_render_without_inline_styles() {
        let html = to_safe_html("| a | b |\n|:--|--:|\n| 1 | `x<y` |\n");
        assert!(
            html.contains("<table>") && html.contains("<code>x&lt;y</code>"),
            "{html}"
        );
        assert!(!html.contains("style="), "{html}");
    }
}
