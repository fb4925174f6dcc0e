//! The settings that are one of a few named values.
use clap::ValueEnum;

/// `--nodeport-acceleration`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub(crate) enum NodePortAcceleration {
    #[default]
    Disabled,
    Native,
    BestEffort,
}

impl From<NodePortAcceleration> for crate::datapath::acceleration::Acceleration {
    fn from(mode: NodePortAcceleration) -> Self {
        match mode {
            NodePortAcceleration::Disabled => Self::Disabled,
            NodePortAcceleration::Native => Self::Native,
            NodePortAcceleration::BestEffort => Self::BestEffort,
        }
    }
}

/// `--outside-handover`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub(crate) enum OutsideHandoverMode {
    #[default]
    Off,
    Defer,
    Handover,
}

impl OutsideHandoverMode {
    /// The datapath's mode; `seconds` (0: none) ends a handover.
    #[must_use]
    pub(crate) fn with_end(self, seconds: u64) -> crate::datapath::handover::OutsideHandover {
        use crate::datapath::handover::OutsideHandover;
        match self {
            Self::Off => OutsideHandover::Off,
            Self::Defer => OutsideHandover::Defer,
            Self::Handover => OutsideHandover::Handover {
                ends_after: (seconds != 0).then(|| std::time::Duration::from_secs(seconds)),
            },
        }
    }
}

/// `--socket-lb`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub(crate) enum SocketLbMode {
    #[default]
    All,
    HostNamespace,
}

impl From<SocketLbMode> for crate::datapath::loader::SocketLb {
    fn from(mode: SocketLbMode) -> Self {
        match mode {
            SocketLbMode::All => Self::All,
            SocketLbMode::HostNamespace => Self::HostNamespace,
        }
    }
}

/// `--nodeport-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub(crate) enum NodePortMode {
    #[default]
    Snat,
    Dsr,
    Hybrid,
}

impl From<NodePortMode> for crate::datapath::loader::NodePortMode {
    fn from(mode: NodePortMode) -> Self {
        match mode {
            NodePortMode::Snat => Self::Snat,
            NodePortMode::Dsr => Self::Dsr,
            NodePortMode::Hybrid => Self::Hybrid,
        }
    }
}

/// `--dsr-dispatch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub(crate) enum DsrDispatch {
    #[default]
    Option,
    Ipip,
}

impl From<DsrDispatch> for crate::datapath::loader::DsrDispatch {
    fn from(dispatch: DsrDispatch) -> Self {
        match dispatch {
            DsrDispatch::Option => Self::Option,
            DsrDispatch::Ipip => Self::Ipip,
        }
    }
}

/// `--lb-algorithm` (`crate::model::LbAlgorithm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub(crate) enum LbAlgorithm {
    #[default]
    Random,
    LeastConnections,
    Maglev,
}

impl From<LbAlgorithm> for crate::model::LbAlgorithm {
    fn from(algorithm: LbAlgorithm) -> Self {
        match algorithm {
            LbAlgorithm::Random => Self::Random,
            LbAlgorithm::LeastConnections => Self::LeastConnections,
            LbAlgorithm::Maglev => Self::Maglev,
        }
    }
}
