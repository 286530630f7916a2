//! Reading samples out of a `/metrics` page (Prometheus text or
//! OpenMetrics): enough for the benches' counters, not a full parser.

/// The samples of `metric` (its full name, e.g. `..._total`) that carry
/// labels: each one's label set (what is between the braces) and value. A
/// line whose value does not parse gives NaN, so a broken page shows.
pub fn samples<'a>(text: &'a str, metric: &str) -> impl Iterator<Item = (&'a str, f64)> + 'a {
    let prefix = format!("{metric}{{");
    text.lines().filter_map(move |line| {
        let (labels, value) = line.strip_prefix(prefix.as_str())?.rsplit_once("} ")?;
        Some((labels, value.trim().parse::<f64>().unwrap_or(f64::NAN)))
    })
}

/// The value of label `name` in a label set from [`samples`] (values may
/// hold commas; escaped quotes are not expected in the benches' labels).
pub fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    let key = format!("{name}=\"");
    let mut rest = labels;
    loop {
        if let Some(value) = rest.strip_prefix(key.as_str()) {
            return value.split('"').next();
        }
        // On to the next label: past the end of this one's quoted value.
        let end = rest.find("\",")?;
        rest = &rest[end + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_and_labels_are_read() {
        let page = "# HELP ringway_x_total X.\n\
                    # TYPE ringway_x_total counter\n\
                    ringway_x_total{reason=\"idle\",pod=\"a\"} 3\n\
                    ringway_x_total{reason=\"per_source\",pod=\"a\"} 4.5\n\
                    ringway_x_total_created{reason=\"idle\"} 1.7e9\n\
                    ringway_y_total{reason=\"idle\"} 9\n\
                    ringway_x_total{reason=\"broken\"} many\n";
        let got: Vec<_> = samples(page, "ringway_x_total").collect();
        assert_eq!(got.len(), 3);
        assert_eq!(got[0], ("reason=\"idle\",pod=\"a\"", 3.0));
        assert_eq!(got[1].1, 4.5);
        assert!(got[2].1.is_nan(), "an unparsable value shows as NaN");
        assert_eq!(label(got[0].0, "reason"), Some("idle"));
        assert_eq!(label(got[0].0, "pod"), Some("a"));
        assert_eq!(label(got[0].0, "missing"), None);
        let commas = "dst=\"a,b\",reason=\"idle\",xreason=\"no\"";
        assert_eq!(label(commas, "reason"), Some("idle"));
        assert_eq!(label(commas, "dst"), Some("a,b"));
        assert_eq!(label(commas, "b"), None);
    }
}
