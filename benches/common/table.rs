//! A plain-text table, each column as wide as its widest cell.

/// Prints `header` and `rows`; the columns in `left` are left-aligned,
/// the others (numbers) right-aligned.
pub fn print(header: &[&str], rows: &[Vec<String>], left: &[usize]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let cells = cells.iter().zip(&widths).enumerate().map(|(i, (c, &w))| {
            if left.contains(&i) {
                format!("{c:<w$}")
            } else {
                format!("{c:>w$}")
            }
        });
        println!("{}", cells.collect::<Vec<_>>().join("  ").trim_end());
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}
