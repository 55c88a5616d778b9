//! Text layout as kubectl prints it: Go's `text/tabwriter` column blocks (kubectl's tables use
//! minimum width 6 and padding 3, `describe` 0 and 2) and `duration.HumanDuration` ages.

use std::time::Duration;

/// kubectl's table layout (`printers.GetNewTabWriter`): minimum cell width 6, padding 3.
pub const TABLE: Layout = Layout {
    min_width: 6,
    padding: 3,
};

/// kubectl describe's layout (`tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)`).
pub const DESCRIBE: Layout = Layout {
    min_width: 0,
    padding: 2,
};

/// The widths of a tabwriter.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    /// Least width of a cell, padding included.
    pub min_width: usize,
    /// Spaces added to the widest cell of a column.
    pub padding: usize,
}

impl Layout {
    /// `text` with its tab-terminated cells aligned as Go's tabwriter aligns them: a column is a
    /// block of consecutive lines that have a cell in it; the text after a line's last tab is
    /// not a cell and is not padded. Widths count characters.
    /// Terminal control characters in the text are shown, not sent ([`escape_terminal`]).
    pub fn format(&self, text: &str) -> String {
        let text = escape_terminal(text);
        let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split('\t').collect()).collect();
        let mut out = String::with_capacity(text.len() * 2);
        let mut widths = Vec::new();
        self.block(&lines, &mut widths, &mut out);
        out
    }

    /// Lays out `lines` (each split at its tabs) whose first `widths.len()` columns are sized.
    fn block(&self, lines: &[Vec<&str>], widths: &mut Vec<usize>, out: &mut String) {
        let column = widths.len();
        let mut start = 0;
        let mut i = 0;
        while i < lines.len() {
            if column >= lines[i].len() - 1 {
                i += 1;
                continue;
            }
            self.write(&lines[start..i], widths, out);
            start = i;
            let mut width = self.min_width;
            while i < lines.len() && column < lines[i].len() - 1 {
                width = width.max(lines[i][column].chars().count() + self.padding);
                i += 1;
            }
            widths.push(width);
            self.block(&lines[start..i], widths, out);
            widths.pop();
            start = i;
        }
        self.write(&lines[start..], widths, out);
    }

    fn write(&self, lines: &[Vec<&str>], widths: &[usize], out: &mut String) {
        for line in lines {
            for (j, cell) in line.iter().enumerate() {
                out.push_str(cell);
                if j + 1 < line.len() {
                    let w = widths.get(j).copied().unwrap_or(0);
                    let pad = w.saturating_sub(cell.chars().count());
                    out.extend(std::iter::repeat_n(' ', pad));
                }
            }
            out.push('\n');
        }
    }
}

/// `text` with ESC shown as `^[` and CR as `\r` (kubectl's `EscapeTerminal`, since kubernetes
/// #112553: a container's termination message or a label cannot move the cursor, retitle
/// the terminal or hide a line), and other control characters but tab and newline as `^X`.
pub fn escape_terminal(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\x1b' => out.push_str("^["),
            '\r' => out.push_str("\\r"),
            '\t' | '\n' => out.push(c),
            c if c.is_control() && (c as u32) < 0x20 => {
                out.push('^');
                out.push(char::from(b'@' + c as u8));
            }
            '\x7f' => out.push_str("^?"),
            c => out.push(c),
        }
    }
    out
}

/// How kubectl prints an age (apimachinery's `duration.HumanDuration`): `45s`, `2m5s`, `15m`,
/// `3h20m`, `20h`, `3d4h`, `40d`, `2y10d`; `<invalid>` more than a second in the future.
pub fn human_duration(d: Option<Duration>) -> String {
    let Some(d) = d else {
        return "<invalid>".to_owned();
    };
    let s = d.as_secs();
    if s < 120 {
        return format!("{s}s");
    }
    let m = s / 60;
    if m < 10 {
        return match s % 60 {
            0 => format!("{m}m"),
            r => format!("{m}m{r}s"),
        };
    }
    if m < 180 {
        return format!("{m}m");
    }
    let h = s / 3600;
    if h < 8 {
        return match m % 60 {
            0 => format!("{h}h"),
            r => format!("{h}h{r}m"),
        };
    }
    if h < 48 {
        return format!("{h}h");
    }
    if h < 24 * 8 {
        return match h % 24 {
            0 => format!("{}d", h / 24),
            r => format!("{}d{r}h", h / 24),
        };
    }
    if h < 24 * 365 * 2 {
        return format!("{}d", h / 24);
    }
    if h < 24 * 365 * 8 {
        return match (h / 24) % 365 {
            0 => format!("{}y", h / 24 / 365),
            r => format!("{}y{r}d", h / 24 / 365),
        };
    }
    format!("{}y", h / 24 / 365)
}

/// The age of `t` at `now` as [`human_duration`] prints it; `<unknown>` without a time (as
/// kubectl prints a missing timestamp).
pub fn age(
    t: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    now: jiff::Timestamp,
) -> String {
    let Some(t) = t else {
        return "<unknown>".to_owned();
    };
    let secs = now.as_second() - t.0.as_second();
    // kubectl tolerates a second of clock skew ("almost now").
    if secs < -1 {
        return human_duration(None);
    }
    human_duration(Some(Duration::from_secs(secs.max(0) as u64)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_padded_to_the_widest_cell_and_the_last_is_not() {
        let t = TABLE
            .format("NAME\tREADY\tSTATUS\nweb-node1\t1/1\tRunning\nx\t0/1\tCrashLoopBackOff\n");
        assert_eq!(
            t,
            "NAME        READY   STATUS\n\
             web-node1   1/1     Running\n\
             x           0/1     CrashLoopBackOff\n"
        );
    }

    #[test]
    fn describe_blocks_align_separately() {
        let t = DESCRIBE.format("Name:\tweb\nNamespace:\tdefault\nContainers:\n  c:\n    Image:\tbusybox\n    Restart Count:\t3\n");
        assert_eq!(
            t,
            "Name:       web\nNamespace:  default\nContainers:\n  c:\n    Image:          busybox\n    Restart Count:  3\n"
        );
    }

    #[test]
    fn a_line_without_cells_between_blocks() {
        let t = DESCRIBE.format(
            "Volumes:\t<none>\nContainers:\n  c:\n    Image:\tb\n    Ready:\tTrue\nQoS:\tx\n",
        );
        assert_eq!(
            t,
            "Volumes:  <none>\nContainers:\n  c:\n    Image:  b\n    Ready:  True\nQoS:        x\n"
        );
    }

    #[test]
    fn terminal_control_characters_are_shown_not_sent() {
        let t = DESCRIBE.format("Message:\t\x1b]0;PWNED\x07\x1b[31mRED\rX\n");
        assert_eq!(t, "Message:  ^[]0;PWNED^G^[[31mRED\\rX\n");
    }

    #[test]
    fn ages_as_kubectl_prints_them() {
        let d = |s| human_duration(Some(Duration::from_secs(s)));
        assert_eq!(d(0), "0s");
        assert_eq!(d(119), "119s");
        assert_eq!(d(125), "2m5s");
        assert_eq!(d(600), "10m");
        assert_eq!(d(3 * 3600 + 20 * 60), "3h20m");
        assert_eq!(d(20 * 3600), "20h");
        assert_eq!(d(3 * 86400 + 4 * 3600), "3d4h");
        assert_eq!(d(40 * 86400), "40d");
        assert_eq!(d((365 * 2 + 10) * 86400), "2y10d");
        assert_eq!(d(365 * 9 * 86400), "9y");
        assert_eq!(human_duration(None), "<invalid>");
    }
}
