//! The documentation's internal links hold: every relative link of README.md, CHANGELOG.md,
//! BENCHMARKS.md and the book (docs/) names a file that exists and, with `#anchor`, a
//! heading of that file; so does every `docs/…md#…`, `README.md#…` or `BENCHMARKS.md#…`
//! that a code comment, a configuration file or a test points a reader to. Anchors are
//! headings as mdBook and the forge spell them: lower-cased, punctuation dropped, spaces as
//! `-`, a repeated heading numbered `-1`, `-2`. Then the book as mdBook builds it: every
//! relative link of its HTML holds too (mdbook 0.5.4 on the PATH, as CI installs it).

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives in the workspace")
        .to_path_buf()
}

/// Markdown files to check: the front pages and every page of the book.
fn pages() -> Vec<PathBuf> {
    let root = root();
    let mut pages: Vec<PathBuf> = ["README.md", "CHANGELOG.md", "BENCHMARKS.md"]
        .iter()
        .map(|name| root.join(name))
        .collect();
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("docs/ is readable") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|ext| ext == "md") {
                pages.push(path);
            }
        }
    }
    pages.sort();
    pages
}

/// The lines of `text` outside fenced code blocks, with inline code blanked out.
fn prose(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            lines.push(String::new());
            continue;
        }
        if fenced {
            lines.push(String::new());
            continue;
        }
        let mut out = String::with_capacity(line.len());
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
                out.push(' ');
            } else {
                out.push(if in_code { ' ' } else { c });
            }
        }
        lines.push(out);
    }
    lines
}

/// The anchor a heading gets.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            c if c.is_alphanumeric() || c == '_' || c == '-' => Some(c),
            ' ' => Some('-'),
            _ => None,
        })
        .collect()
}

/// A Markdown file's text with mdBook's `{{#include path}}` lines replaced by the files
/// they name, as the book shows it (`docs/benchmarks.md` is BENCHMARKS.md).
fn included(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(|line| {
            match line
                .trim()
                .strip_prefix("{{#include ")
                .and_then(|rest| rest.strip_suffix("}}"))
            {
                Some(name) => included(&path.parent().expect("a file's folder").join(name.trim())),
                None => line.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every anchor of a Markdown file.
fn anchors(path: &Path) -> BTreeSet<String> {
    let text = included(path);
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut anchors = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let heading = line.trim_start_matches('#').replace('`', "");
        let base = slug(&heading);
        let count = seen.entry(base.clone()).or_default();
        anchors.insert(match *count {
            0 => base.clone(),
            n => format!("{base}-{n}"),
        });
        *count += 1;
    }
    anchors
}

/// The targets of `[text](target)` links in a line of prose.
fn link_targets(line: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = line;
    while let Some(start) = rest.find("](") {
        let after = &rest[start + 2..];
        let Some(end) = after.find(')') else { break };
        let target = after[..end].split_whitespace().next().unwrap_or("");
        targets.push(target.to_owned());
        rest = &after[end..];
    }
    targets
}

/// Why `target`, linked from `from`, does not hold; `None` when it does.
fn broken(from: &Path, target: &str) -> Option<String> {
    if target.is_empty()
        || target.contains("://")
        || target.starts_with("mailto:")
        || target.starts_with('<')
    {
        return None;
    }
    let (file, anchor) = match target.split_once('#') {
        Some((file, anchor)) => (file, Some(anchor)),
        None => (target, None),
    };
    let path = if file.is_empty() {
        from.to_path_buf()
    } else {
        from.parent().expect("a file's folder").join(file)
    };
    if !path.exists() {
        return Some(format!("{target}: no file {}", path.display()));
    }
    let anchor = anchor.filter(|anchor| !anchor.is_empty())?;
    if path.extension().is_some_and(|ext| ext == "md") && !anchors(&path).contains(anchor) {
        return Some(format!(
            "{target}: no heading with anchor #{anchor} in {}",
            path.display()
        ));
    }
    None
}

#[test]
fn every_internal_link_of_the_docs_holds() {
    let mut problems = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("a readable page");
        for (number, line) in prose(&text).iter().enumerate() {
            for target in link_targets(line) {
                if let Some(problem) = broken(&page, &target) {
                    problems.push(format!("{}:{}: {problem}", page.display(), number + 1));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

/// Files outside the docs that point a reader into them.
fn sources() -> Vec<PathBuf> {
    let root = root();
    let mut files = Vec::new();
    let mut dirs = vec![
        root.join("crates"),
        root.join("tests"),
        root.join("config"),
        root.join("deploy"),
        root.join(".ci"),
        root.join(".cargo"),
        root.join(".config"),
    ];
    files.push(root.join("Cargo.toml"));
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|ext| {
                ["rs", "toml", "yml", "yaml", "json", "sh"].contains(&ext.to_str().unwrap_or(""))
            }) || path
                .file_name()
                .is_some_and(|name| name == "run" || name == "Containerfile")
            {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// `docs/x.md#a`, `README.md#a` and `BENCHMARKS.md#a` as written in `line`, relative to
/// the workspace's root.
fn doc_references(line: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (start, _) in line.match_indices(".md") {
        let before = &line[..start];
        let begin = before
            .rfind(|c: char| !(c.is_alphanumeric() || "/_-.".contains(c)))
            .map_or(0, |i| i + 1);
        let name = &line[begin..start + 3];
        let is_doc = name.starts_with("docs/")
            || name == "README.md"
            || name == "BENCHMARKS.md"
            || name == "CHANGELOG.md";
        if !is_doc {
            continue;
        }
        let after = &line[start + 3..];
        let anchor: String = after
            .strip_prefix('#')
            .map(|rest| {
                rest.chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '-' || *c == '_')
                    .collect()
            })
            .unwrap_or_default();
        found.push(if anchor.is_empty() {
            name.to_owned()
        } else {
            format!("{name}#{anchor}")
        });
    }
    found
}

#[test]
fn every_pointer_from_the_code_into_the_docs_holds() {
    let root = root();
    let this = PathBuf::from(file!());
    let mut problems = Vec::new();
    for file in sources() {
        if file.ends_with(&this) {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for (number, line) in text.lines().enumerate() {
            for reference in doc_references(line) {
                if let Some(problem) = broken(&root.join("Cargo.toml"), &reference) {
                    problems.push(format!("{}:{}: {problem}", file.display(), number + 1));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "pointers into the docs that do not hold:\n{}",
        problems.join("\n")
    );
}

/// Every `.html` file under `dir`.
fn html_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("the built book is readable") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|ext| ext == "html") {
                files.push(path);
            }
        }
    }
    files
}

/// The values of `attribute="…"` in `html`, entities `&amp;` and `&quot;` decoded.
fn attribute_values<'a>(html: &'a str, attribute: &'a str) -> impl Iterator<Item = String> + 'a {
    html.split(attribute).skip(1).filter_map(|rest| {
        let value = &rest[..rest.find('"')?];
        Some(value.replace("&amp;", "&").replace("&quot;", "\""))
    })
}

/// The page a link to `page` shows: `page` itself, or where a redirect page made for
/// book.toml's `[output.html.redirect]` sends the reader (keeping the fragment).
fn shown(page: &Path) -> PathBuf {
    let html = std::fs::read_to_string(page).unwrap_or_default();
    let redirect = attribute_values(&html, r#"http-equiv="refresh" content="0; URL="#).next();
    match redirect {
        Some(to) => page.parent().expect("a page's folder").join(to),
        None => page.to_path_buf(),
    }
}

/// The book as mdBook 0.5.4 builds it (as CI does): every relative `href` of every page
/// names a file of the book and, with `#id` into another page, an element of that page.
#[test]
fn every_link_of_the_built_book_holds() {
    let book = std::env::temp_dir().join(format!("outbox-relay-book-{}", std::process::id()));
    let built = std::process::Command::new("mdbook")
        .arg("build")
        .arg(root().join("docs"))
        .arg("--dest-dir")
        .arg(&book)
        .output()
        .unwrap_or_else(|error| {
            panic!(
                "mdbook is needed to build the book ({error}): \
                 cargo install --locked mdbook --version 0.5.4 --no-default-features"
            )
        });
    assert!(
        built.status.success(),
        "mdbook build docs failed:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let mut ids: HashMap<PathBuf, BTreeSet<String>> = HashMap::new();
    let mut problems = Vec::new();
    for page in html_files(&book) {
        let html = std::fs::read_to_string(&page).expect("a readable page");
        for href in attribute_values(&html, "href=\"") {
            let external = href.contains("://")
                || href.starts_with("mailto:")
                || href.starts_with("javascript:")
                || href.starts_with('/');
            let (file, fragment) = href.split_once('#').unwrap_or((&href, ""));
            if external || file.is_empty() {
                continue;
            }
            let target = page.parent().expect("a page's folder").join(file);
            let name = page.strip_prefix(&book).unwrap_or(&page).display();
            if !target.is_file() {
                problems.push(format!("{name}: {href}: no such file"));
            } else if !fragment.is_empty() {
                let target = shown(&target);
                let known = ids.entry(target.clone()).or_insert_with(|| {
                    let html = std::fs::read_to_string(&target).unwrap_or_default();
                    attribute_values(&html, " id=\"").collect()
                });
                if !known.contains(fragment) {
                    problems.push(format!("{name}: {href}: no id {fragment:?} there"));
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&book);
    assert!(
        problems.is_empty(),
        "broken links in the built book:\n{}",
        problems.join("\n")
    );
}

#[test]
fn anchors_are_spelled_as_the_book_spells_them() {
    assert_eq!(
        slug("Claims, leases and ordering"),
        "claims-leases-and-ordering"
    );
    assert_eq!(
        slug("`relay.lease` and `publish_timeout`"),
        "relaylease-and-publish_timeout"
    );
    assert_eq!(
        link_targets("see [a](b.md#c) and [d](https://e) and [f](g.md)"),
        ["b.md#c", "https://e", "g.md"]
    );
    assert_eq!(
        doc_references("// docs/design.md#the-pipeline, and README.md"),
        ["docs/design.md#the-pipeline", "README.md"]
    );
}
