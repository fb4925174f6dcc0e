//! One file per subcommand.
pub mod cleanup;
pub mod demo;
pub mod run;
pub mod service;
pub mod status;
