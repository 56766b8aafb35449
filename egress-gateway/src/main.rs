fn main() -> anyhow::Result<()> {
    anyhow::bail!("daiv-egress-gateway: not implemented yet")
}
