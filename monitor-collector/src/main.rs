//! `railscope-collector`: the collector's binary (`railscope collector ...` runs it).

fn main() -> anyhow::Result<()> {
    anyhow::bail!("the collector is being built: see issue 11")
}
