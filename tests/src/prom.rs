//! Reading a `/metrics` page: the one parser of Prometheus text (0.0.4) and
//! OpenMetrics text of the tests and benches, and the lookups they make.
//!
//! Label values are read as the formats define them: quoted, with `\\`,
//! `\"` and `\n` escaped, and free to hold `,`, `=`, `{` or `}`. A page
//! that does not parse is an error, never an empty or partial result.
//!
//! Why not a crate: `prometheus-parse` 0.2.5 splits a label set at every
//! `,` and `=` and keeps escapes as written (`a="x\"y"` reads `x\"y`,
//! `k="p,q"` reads `p`, `e="u=v"` is dropped); `openmetrics-parser` is
//! LGPL-3.0; `prom_text_format_parser` keeps escapes as written and pulls
//! in second versions of `derive_more`, `syn` and `strum`.

use std::collections::BTreeMap;
use std::fmt;

/// A line of a page that is not a sample, a comment or blank.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line} of the metrics page: {why}: {text:?}")]
pub struct ParseError {
    /// 1-based.
    pub line: usize,
    /// What is wrong.
    pub why: &'static str,
    /// The line.
    pub text: String,
}

/// One sample: its name (with any `_total`, `_bucket`, ... suffix), its
/// labels (values unescaped) and its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The series name as written.
    pub name: String,
    /// Label name to (unescaped) value.
    pub labels: BTreeMap<String, String>,
    /// The value (`NaN`, `+Inf` and `-Inf` included).
    pub value: f64,
}

impl Sample {
    /// The value of label `name`, if the sample has it.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels.get(name).map(String::as_str)
    }

    /// Whether every label of `want` is on this sample with the same value.
    pub fn has(&self, want: &BTreeMap<String, String>) -> bool {
        want.iter().all(|(k, v)| self.labels.get(k) == Some(v))
    }
}

impl fmt::Display for Sample {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{:?} {}", self.name, self.labels, self.value)
    }
}

/// A parsed page: its samples in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metrics {
    /// Every sample of the page.
    pub samples: Vec<Sample>,
}

impl Metrics {
    /// Parses Prometheus text or OpenMetrics text.
    pub fn parse(text: &str) -> Result<Metrics, ParseError> {
        let mut samples = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() || line.starts_with('#') {
                continue;
            }
            let err = |why| ParseError {
                line: i + 1,
                why,
                text: line.to_string(),
            };
            samples.push(sample_line(line).map_err(err)?);
        }
        Ok(Metrics { samples })
    }

    /// The samples named `name` whose labels include every one of
    /// `matchers` (each `key="value"`, as in a PromQL selector: equal
    /// values, escapes as on the page).
    ///
    /// Panics on a malformed matcher (a bug in the test).
    pub fn matching<'a>(
        &'a self,
        name: &'a str,
        matchers: &[&str],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        let want = matchers_of(matchers);
        self.samples
            .iter()
            .filter(move |s| s.name == name && s.has(&want))
    }

    /// The value of the first sample [`matching`](Self::matching).
    pub fn get(&self, name: &str, matchers: &[&str]) -> Option<f64> {
        self.matching(name, matchers).next().map(|s| s.value)
    }

    /// The sum of the samples [`matching`](Self::matching) (0 when none).
    pub fn sum(&self, name: &str, matchers: &[&str]) -> f64 {
        self.matching(name, matchers).map(|s| s.value).sum()
    }
}

/// Parses `text`, panicking with the error (a page that does not parse must
/// fail the test, never read as empty).
pub fn parse(text: &str) -> Metrics {
    Metrics::parse(text).unwrap_or_else(|e| panic!("{e}"))
}

/// [`Metrics::get`] of the page `text` (panics when it does not parse).
pub fn value(text: &str, name: &str, matchers: &[&str]) -> Option<f64> {
    parse(text).get(name, matchers)
}

/// [`Metrics::sum`] of the page `text` (panics when it does not parse).
pub fn sum(text: &str, name: &str, matchers: &[&str]) -> f64 {
    parse(text).sum(name, matchers)
}

fn matchers_of(matchers: &[&str]) -> BTreeMap<String, String> {
    let mut want = BTreeMap::new();
    for m in matchers {
        let mut rest = *m;
        let labels = label_pairs(&mut rest)
            .ok()
            .filter(|_| rest.trim().is_empty())
            .unwrap_or_else(|| panic!("not a label matcher (key=\"value\"): {m:?}"));
        want.extend(labels);
    }
    want
}

fn sample_line(line: &str) -> Result<Sample, &'static str> {
    let name_end = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(line.len());
    let name = &line[..name_end];
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        return Err("no metric name");
    }
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(after) = rest.strip_prefix('{') {
        rest = after;
        labels = label_pairs(&mut rest)?;
        rest = rest.strip_prefix('}').ok_or("label set not closed")?;
    }
    // Value, then an optional timestamp, then (OpenMetrics) an optional
    // exemplar after ` # `.
    let rest = rest.split(" # ").next().unwrap_or_default();
    if !rest.starts_with([' ', '\t']) {
        return Err("no space before the value");
    }
    let mut fields = rest.split_whitespace();
    let value = fields.next().ok_or("no value")?;
    let value = match value {
        "+Inf" | "Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        v => v.parse().map_err(|_| "value is not a number")?,
    };
    if let Some(ts) = fields.next() {
        ts.parse::<f64>().map_err(|_| "timestamp is not a number")?;
    }
    if fields.next().is_some() {
        return Err("text after the timestamp");
    }
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// Reads `key="value"` pairs (`,`-separated, a trailing `,` allowed) from
/// the start of `rest`, up to (not past) a `}` or the end; `rest` is left
/// there.
fn label_pairs(rest: &mut &str) -> Result<BTreeMap<String, String>, &'static str> {
    let mut labels = BTreeMap::new();
    loop {
        let s = rest.trim_start();
        if s.is_empty() || s.starts_with('}') {
            *rest = s;
            return Ok(labels);
        }
        let key_end = s
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .ok_or("label without a value")?;
        let key = &s[..key_end];
        if key.is_empty() || key.starts_with(|c: char| c.is_ascii_digit()) {
            return Err("bad label name");
        }
        let s = s[key_end..].trim_start();
        let s = s.strip_prefix('=').ok_or("no `=` after a label name")?;
        let s = s.trim_start();
        let s = s.strip_prefix('"').ok_or("label value not quoted")?;
        let mut value = String::new();
        let mut chars = s.char_indices();
        let end = loop {
            match chars.next().ok_or("label value not closed")? {
                (i, '"') => break i,
                (_, '\\') => match chars.next().ok_or("label value not closed")?.1 {
                    '\\' => value.push('\\'),
                    '"' => value.push('"'),
                    'n' => value.push('\n'),
                    _ => return Err("unknown escape in a label value"),
                },
                (_, c) => value.push(c),
            }
        };
        if labels.insert(key.to_string(), value).is_some() {
            return Err("label repeated");
        }
        let s = s[end + 1..].trim_start();
        *rest = match s.strip_prefix(',') {
            Some(after) => after,
            None if s.is_empty() || s.starts_with('}') => s,
            None => return Err("no `,` between labels"),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "# HELP ringway_x_total X.\n\
        # TYPE ringway_x_total counter\n\
        ringway_x_total{reason=\"idle\",pod=\"a\"} 3\n\
        ringway_x_total{reason=\"per_source\",pod=\"a\"} 4.5\n\
        ringway_x_total_created{reason=\"idle\"} 1.7e9\n\
        ringway_up 1\n\
        ringway_lat_bucket{le=\"+Inf\"} 7 1700000000000\n\
        ringway_g{a=\"b\",} NaN\n\
        # EOF\n";

    #[test]
    fn samples_values_and_lookups() {
        let m = Metrics::parse(PAGE).unwrap();
        assert_eq!(m.samples.len(), 6);
        assert_eq!(m.get("ringway_x_total", &["reason=\"idle\""]), Some(3.0));
        assert_eq!(m.sum("ringway_x_total", &["pod=\"a\""]), 7.5);
        assert_eq!(m.sum("ringway_x_total", &[]), 7.5);
        assert_eq!(m.get("ringway_x_total", &["reason=\"id\""]), None);
        assert_eq!(m.get("ringway_x", &[]), None, "names are whole");
        assert_eq!(m.get("ringway_up", &[]), Some(1.0));
        assert_eq!(m.get("ringway_lat_bucket", &["le=\"+Inf\""]), Some(7.0));
        assert!(m.get("ringway_g", &["a=\"b\""]).unwrap().is_nan());
        assert_eq!(
            m.matching("ringway_x_total", &[])
                .map(|s| s.label("reason").unwrap())
                .collect::<Vec<_>>(),
            ["idle", "per_source"]
        );
    }

    /// `\"`, `\\` and `\n` in a label value are read as `"`, `\` and a line
    /// feed; `,`, `=`, `{`, `}` and ` # ` inside a value are part of it.
    #[test]
    fn escaped_and_awkward_label_values_parse() {
        let page = concat!(
            r#"m{a="x\"y",b="c\\d",n="l1\nl2",k="p,q",e="u=v",br="{}",h=" # "} 2"#,
            "\n",
            r#"m{a="\\\"",b="\\n"} 3"#,
            "\n",
        );
        let m = Metrics::parse(page).unwrap();
        let s = &m.samples[0];
        assert_eq!(s.label("a"), Some("x\"y"));
        assert_eq!(s.label("b"), Some("c\\d"));
        assert_eq!(s.label("n"), Some("l1\nl2"));
        assert_eq!(s.label("k"), Some("p,q"));
        assert_eq!(s.label("e"), Some("u=v"));
        assert_eq!(s.label("br"), Some("{}"));
        assert_eq!(s.label("h"), Some(" # "));
        assert_eq!(s.value, 2.0);
        // Matchers are written as on the page, escapes included.
        assert_eq!(m.get("m", &[r#"a="x\"y""#, r#"n="l1\nl2""#]), Some(2.0));
        assert_eq!(m.samples[1].label("a"), Some("\\\""));
        assert_eq!(m.samples[1].label("b"), Some("\\n"));
        assert_eq!(m.get("m", &[r#"b="\\n""#]), Some(3.0));
    }

    #[test]
    fn a_broken_page_is_an_error_naming_the_line() {
        for (bad, why) in [
            ("m{a=\"x} 1", "label value not closed"),
            ("m{a=\"x\\q\"} 1", "unknown escape in a label value"),
            ("m{a=x} 1", "label value not quoted"),
            ("m{a=\"1\" b=\"2\"} 1", "no `,` between labels"),
            ("m{a=\"1\",a=\"2\"} 1", "label repeated"),
            ("m many", "value is not a number"),
            ("m", "no space before the value"),
            ("{a=\"1\"} 1", "no metric name"),
        ] {
            let e = Metrics::parse(&format!("ok 1\n{bad}\n")).unwrap_err();
            assert_eq!((e.line, e.why), (2, why), "{bad}");
        }
    }

    #[test]
    #[should_panic(expected = "not a label matcher")]
    fn a_malformed_matcher_panics() {
        Metrics::default().get("m", &["reason=idle"]);
    }
}
