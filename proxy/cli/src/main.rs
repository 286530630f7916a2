//! The `ringway` binary. Everything it does is in the crate's library
//! ([`ringway::main`]), so the benches run the very same entry point.

fn main() -> anyhow::Result<()> {
    ringway::main()
}
