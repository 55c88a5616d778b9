//! Bounded YAML decoding: a linear pre-scan that refuses input whose parsing would not be
//! (YAML/JSON flow collections nested deeper than [`MAX_FLOW_DEPTH`]; libyaml's cost grows with
//! the square of that depth: 20,000 levels take about a second, 100,000 about 50 s), before the
//! parser sees it; and aliases (`*name`) whose replay could build far more than the text holds
//! ([`MAX_ALIAS_EXPANSION`]): serde_yaml bounds how many times aliases are followed, not how much
//! each one replays, so 10,000 aliases of a 10,000-item anchor (50 KB of text) would build 100
//! million values. Block nesting (indentation) is bounded by serde_yaml's recursion limit, and
//! the size of every input by its reader. Used for manifests and for the configuration file.

/// Deepest nesting of flow collections (`[...]`, `{...}`) accepted. A pod in JSON nests about
/// ten levels.
pub const MAX_FLOW_DEPTH: usize = 64;

/// Bound on (aliases in the text) × (length of the text, bytes): each alias replays at most the
/// whole text, so this bounds what aliases can build to about this many bytes of text. 100
/// aliases in a 20 KB manifest pass.
pub const MAX_ALIAS_EXPANSION: usize = 2 << 20;

/// Checks `bytes` in one pass, outside quoted scalars, comments and block scalars.
///
/// Errors: a message naming the line where flow collections nest deeper than
/// [`MAX_FLOW_DEPTH`], or saying how many aliases the text uses when they exceed
/// [`MAX_ALIAS_EXPANSION`].
pub fn check_nesting(bytes: &[u8]) -> Result<(), String> {
    let mut aliases = 0usize;
    let mut depth = 0usize;
    let mut line = 1usize;
    // Indentation of the line whose value is a block scalar (`|`, `>`): deeper lines are text.
    let mut block_scalar: Option<usize> = None;
    let mut i = 0;
    while i < bytes.len() {
        // At a line start: measure the indentation and skip block scalar text.
        let start = i;
        while i < bytes.len() && bytes[i] == b' ' {
            i += 1;
        }
        let indent = i - start;
        let blank = i >= bytes.len() || bytes[i] == b'\n' || bytes[i] == b'\r';
        if let Some(parent) = block_scalar {
            if blank || indent > parent {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
                i += 1;
                line += 1;
                continue;
            }
            block_scalar = None;
        }
        // The rest of the line.
        let mut prev = b' ';
        let mut last_significant = b' ';
        while i < bytes.len() && bytes[i] != b'\n' {
            let b = bytes[i];
            let at_token = matches!(prev, b' ' | b'\t' | b'[' | b'{' | b',' | b':');
            match b {
                b'#' if matches!(prev, b' ' | b'\t') || i == start + indent => {
                    while i < bytes.len() && bytes[i] != b'\n' {
                        i += 1;
                    }
                    break;
                }
                b'\'' | b'"' if at_token => {
                    // A quoted scalar, possibly over several lines.
                    i += 1;
                    while i < bytes.len() {
                        match bytes[i] {
                            b'\\' if b == b'"' => i += 1,
                            b'\'' if b == b'\'' && bytes.get(i + 1) == Some(&b'\'') => i += 1,
                            c if c == b => break,
                            b'\n' => line += 1,
                            _ => {}
                        }
                        i += 1;
                    }
                }
                b'[' | b'{' => {
                    depth += 1;
                    if depth > MAX_FLOW_DEPTH {
                        return Err(format!(
                            "collections nest more than {MAX_FLOW_DEPTH} levels deep at line {line}; refused before parsing"
                        ));
                    }
                }
                b']' | b'}' => depth = depth.saturating_sub(1),
                b'*' if at_token
                    && bytes
                        .get(i + 1)
                        .is_some_and(|c| !c.is_ascii_whitespace() && !b",[]{}".contains(c)) =>
                {
                    aliases += 1;
                }
                _ => {}
            }
            if !matches!(b, b' ' | b'\t' | b'\r') {
                last_significant = b;
            }
            prev = b;
            i += 1;
        }
        // `key: |` or `- >-`: the lines below are a block scalar.
        if depth == 0 && matches!(last_significant, b'|' | b'>' | b'-' | b'+' | b'0'..=b'9') {
            let text = &bytes[start..i.min(bytes.len())];
            let trimmed = trim_end(text);
            let tail: Vec<u8> = trimmed
                .iter()
                .rev()
                .take_while(|c| matches!(c, b'|' | b'>' | b'-' | b'+' | b'0'..=b'9'))
                .copied()
                .collect();
            let head = &trimmed[..trimmed.len() - tail.len()];
            let introduces = tail.iter().any(|c| matches!(c, b'|' | b'>'))
                && (head.ends_with(b": ") || head.ends_with(b"- ") || head.is_empty());
            if introduces {
                block_scalar = Some(indent);
            }
        }
        i += 1;
        line += 1;
    }
    if aliases.saturating_mul(bytes.len()) > MAX_ALIAS_EXPANSION {
        return Err(format!(
            "{aliases} YAML aliases in {} bytes could expand beyond {MAX_ALIAS_EXPANSION} bytes; refused before parsing",
            bytes.len()
        ));
    }
    Ok(())
}

fn trim_end(s: &[u8]) -> &[u8] {
    let end = s
        .iter()
        .rposition(|c| !matches!(c, b' ' | b'\t' | b'\r'))
        .map_or(0, |p| p + 1);
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_aliases_of_a_large_anchor_are_refused_and_a_few_pass() {
        let items = vec!["0"; 10_000].join(",");
        let uses = vec!["*a"; 10_000].join(",");
        let bomb = format!("a: &a [{items}]\nb: [{uses}]\n");
        let e = check_nesting(bomb.as_bytes()).unwrap_err();
        assert!(e.contains("10000 YAML aliases"), "{e}");
        let shared = "x: &env [{name: A, value: '1'}]\nspec:\n  containers:\n  - {name: a, env: *env}\n  - {name: b, env: *env}\n";
        assert_eq!(check_nesting(shared.as_bytes()), Ok(()));
        // Not aliases: a glob in a quoted or plain scalar after other text, a comment.
        let text = "command: [sh, -c, 'ls *.txt']\nargs: [a*b]\n# *c\n";
        assert_eq!(check_nesting(text.repeat(20_000).as_bytes()), Ok(()));
    }

    #[test]
    fn deep_flow_nesting_is_refused_before_parsing_and_real_manifests_pass() {
        let deep = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: deep, labels: {}{}}}\n",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        let e = check_nesting(deep.as_bytes()).unwrap_err();
        assert!(e.contains("line 3"), "{e}");
        let ok = [
            "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec:\n  containers:\n  - {name: c, image: b, command: [sh, -c, 'echo [[[[ {{{{']}\n",
            "{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{\"name\":\"j\"},\"spec\":{\"containers\":[{\"name\":\"c\",\"image\":\"b\",\"args\":[\"[[[[\"]}]}}",
            "spec:\n  containers:\n  - name: c\n    command:\n    - sh\n    - -c\n    - |\n      if [[ -f x ]]; then echo \"[[[[[[[[[[[[\"; fi\n      a='[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[['\n      # [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\n    image: b # a comment with [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\n",
        ];
        for text in ok {
            assert_eq!(check_nesting(text.as_bytes()), Ok(()), "{text}");
        }
        let at_limit = format!(
            "a: {}{}\n",
            "[".repeat(MAX_FLOW_DEPTH),
            "]".repeat(MAX_FLOW_DEPTH)
        );
        assert_eq!(check_nesting(at_limit.as_bytes()), Ok(()));
        let over = format!(
            "a: {}{}\n",
            "[".repeat(MAX_FLOW_DEPTH + 1),
            "]".repeat(MAX_FLOW_DEPTH + 1)
        );
        assert!(check_nesting(over.as_bytes()).is_err());
    }
}
