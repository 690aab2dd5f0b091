#![no_std]
// This library target exists so monitor-user can declare a build-dependency on this crate
// (see monitor-user/Cargo.toml); the probes are the binary target in main.rs.
