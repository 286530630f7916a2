//! `ringway-bench-proxy`: the `ringway` program, built with the bench's profile
//! beside the suite. It is not a copy: it runs [`ringway::main`], the entry
//! point of the `ringway` binary, so the suite measures exactly what ships
//! (`ringway-bench-proxy proxy --pod ...` is `ringway proxy --pod ...`).

fn main() -> anyhow::Result<()> {
    ringway::main()
}
