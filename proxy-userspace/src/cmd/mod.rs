//! One file per subcommand.
pub mod demo;
pub mod run;
