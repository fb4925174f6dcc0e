//! Exists so that `proxy-userspace` can name this crate as a build dependency
//! (aya-build then rebuilds the eBPF object when these sources change).
#![no_std]
