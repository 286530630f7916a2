//! The `ringway` binary.
fn main() {}
