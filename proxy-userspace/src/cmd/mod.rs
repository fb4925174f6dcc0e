//! One file per subcommand.
pub mod cleanup;
pub mod completion;
pub mod demo;
pub mod explain;
pub(crate) mod output;
pub mod run;
pub mod service;
pub mod status;
