//! Link options for the agent binary alone.
//!
//! On glibc targets the agent is linked with packed relative relocations
//! (`-z pack-relative-relocs`, DT_RELR): a position-independent executable
//! otherwise carries one 24-byte (12 on armhf) relocation record per pointer
//! in its read-only data, about 340 KiB of the amd64 binary, where DT_RELR
//! keeps a bitmap of a few KiB. The loader needs glibc 2.36 (Debian 12,
//! Raspberry Pi OS bookworm), which the .deb depends on; the linker adds the
//! `GLIBC_ABI_DT_RELR` version need, so an older glibc refuses to start the
//! binary instead of misreading it. rustc's own LLD (amd64 builds) and GNU
//! ld from 2.38 pack them for x86-64; bookworm's GNU ld (2.40) does not yet
//! for arm64 or armhf and ignores the option there, so those binaries keep
//! their ordinary relocations (the .deb's floor stays 2.36 on every
//! architecture: one agent, one floor).

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        println!("cargo::rustc-link-arg-bin=drover-agent=-Wl,-z,pack-relative-relocs");
    }
}
