//! Errors and warnings of the loader.

use std::fmt;
use std::path::PathBuf;

use crate::ini::{IniSyntaxError, Origin};

/// An option whose value does not parse, or breaks a rule of its option.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidValue {
    pub section: String,
    pub option: String,
    pub value: String,
    /// What the option accepts, e.g. `expected an integer`.
    pub expected: String,
    pub origin: Origin,
}

impl fmt::Display for InvalidValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{}] {} = {:?}: {} (from {})",
            self.section, self.option, self.value, self.expected, self.origin
        )
    }
}

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file syntax error: {0}")]
    Syntax(#[from] IniSyntaxError),
    #[error("invalid section [{section}]: {reason}")]
    BadDeploymentName { section: String, reason: String },
    #[error("environment variable {var}: {message}")]
    Env { var: String, message: String },
    /// Every bad value found, so one run shows all of them.
    #[error("{}", join(.0))]
    Invalid(Vec<InvalidValue>),
    /// Options that must be set given others (e.g. credentials for `auth_type = password`).
    #[error("{}", join(.0))]
    Missing(Vec<MissingOption>),
}

/// An option that has to be set because of another option's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingOption {
    pub section: String,
    /// The option, or alternatives joined with " or ".
    pub option: String,
    /// Why it is needed, e.g. `auth_type = password`.
    pub because: String,
}

impl fmt::Display for MissingOption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{}] {} must be set with {}",
            self.section, self.option, self.because
        )
    }
}

impl ConfigError {
    /// The bad values, when this is a value error.
    pub fn invalid_values(&self) -> &[InvalidValue] {
        match self {
            ConfigError::Invalid(v) => v,
            _ => &[],
        }
    }
}

fn join<T: fmt::Display>(errors: &[T]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Something worth telling the operator that does not stop kuryr from starting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Warning {
    /// A section kuryr does not know (e.g. `[oslo_concurrency]` of another service).
    UnknownSection { section: String, origin: Option<Origin> },
    /// An option kuryr does not know in a known section (often a typo).
    UnknownOption {
        section: String,
        option: String,
        origin: Origin,
    },
    /// A deprecated option that is still honoured.
    Deprecated {
        section: String,
        option: String,
        advice: String,
        origin: Origin,
    },
    /// A `KURYR__…` environment variable that does not name a section and option.
    MalformedEnvVar { var: String },
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Warning::UnknownSection {
                section,
                origin: Some(o),
            } => {
                write!(f, "unknown section [{section}] (from {o}) is ignored")
            }
            Warning::UnknownSection {
                section,
                origin: None,
            } => write!(f, "unknown section [{section}] is ignored"),
            Warning::UnknownOption {
                section,
                option,
                origin,
            } => {
                write!(
                    f,
                    "unknown option [{section}] {option} (from {origin}) is ignored"
                )
            }
            Warning::Deprecated {
                section,
                option,
                advice,
                origin,
            } => {
                write!(
                    f,
                    "option [{section}] {option} (from {origin}) is deprecated: {advice}"
                )
            }
            Warning::MalformedEnvVar { var } => write!(
                f,
                "environment variable {var} is ignored: expected KURYR__<SECTION>__<OPTION> or \
                 KURYR__DEPLOYMENT__<NAME>__<OPTION>"
            ),
        }
    }
}
