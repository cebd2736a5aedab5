//! Label selectors (`matchLabels` + `matchExpressions`), validated once and matched purely.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::Serialize;

use super::spec::PolicyError;

pub type Labels = BTreeMap<String, String>;

/// One requirement of a selector.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Requirement {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A validated label selector; the empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

impl Selector {
    /// Validates `sel`; errors name the field under `path` (e.g. `spec.podSelector`).
    pub fn parse(sel: &LabelSelector, path: &str) -> Result<Self, PolicyError> {
        let mut requirements = vec![];
        for (k, v) in sel.match_labels.iter().flatten() {
            requirements.push(Requirement::In(k.clone(), vec![v.clone()]));
        }
        for (i, e) in sel.match_expressions.iter().flatten().enumerate() {
            let field = format!("{path}.matchExpressions[{i}]");
            let mut values = e.values.clone().unwrap_or_default();
            values.sort();
            values.dedup();
            let key = e.key.clone();
            if key.is_empty() {
                return Err(PolicyError::new(format!("{field}.key"), "must not be empty"));
            }
            let r = match e.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    return Err(PolicyError::new(
                        format!("{field}.values"),
                        format!("must be non-empty for operator {}", e.operator),
                    ));
                }
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return Err(PolicyError::new(
                        format!("{field}.values"),
                        format!("must be empty for operator {}", e.operator),
                    ));
                }
                "In" => Requirement::In(key, values),
                "NotIn" => Requirement::NotIn(key, values),
                "Exists" => Requirement::Exists(key),
                "DoesNotExist" => Requirement::DoesNotExist(key),
                other => {
                    return Err(PolicyError::new(
                        format!("{field}.operator"),
                        format!("{other:?} is not one of In, NotIn, Exists, DoesNotExist"),
                    ));
                }
            };
            requirements.push(r);
        }
        requirements.sort();
        requirements.dedup();
        Ok(Self { requirements })
    }

    pub fn everything() -> Self {
        Self::default()
    }

    pub fn matches(&self, labels: &Labels) -> bool {
        self.requirements.iter().all(|r| match r {
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
        })
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    use super::*;

    fn labels(kv: &[(&str, &str)]) -> Labels {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        }
    }

    #[test]
    fn match_labels_and_expressions_are_anded() {
        let sel = Selector::parse(
            &LabelSelector {
                match_labels: Some([("app".to_string(), "web".to_string())].into()),
                match_expressions: Some(vec![
                    expr("tier", "In", &["a", "b"]),
                    expr("env", "NotIn", &["prod"]),
                    expr("team", "Exists", &[]),
                    expr("legacy", "DoesNotExist", &[]),
                ]),
            },
            "spec.podSelector",
        )
        .expect("valid");
        let ok = labels(&[("app", "web"), ("tier", "b"), ("team", "x")]);
        assert!(sel.matches(&ok));
        let mut l = ok.clone();
        l.insert("env".into(), "prod".into());
        assert!(!sel.matches(&l), "NotIn value");
        let mut l = ok.clone();
        l.insert("legacy".into(), "".into());
        assert!(!sel.matches(&l), "DoesNotExist key present");
        let mut l = ok.clone();
        l.remove("team");
        assert!(!sel.matches(&l), "Exists key absent");
        let mut l = ok;
        l.insert("tier".into(), "c".into());
        assert!(!sel.matches(&l), "In value not listed");
        assert!(Selector::everything().matches(&Labels::new()));
    }

    #[test]
    fn invalid_expressions_name_the_field() {
        let bad = |e| {
            Selector::parse(
                &LabelSelector {
                    match_expressions: Some(vec![e]),
                    ..Default::default()
                },
                "spec.podSelector",
            )
            .expect_err("invalid")
        };
        assert_eq!(
            bad(expr("a", "Like", &["x"])).field,
            "spec.podSelector.matchExpressions[0].operator"
        );
        assert_eq!(
            bad(expr("a", "In", &[])).field,
            "spec.podSelector.matchExpressions[0].values"
        );
        assert_eq!(
            bad(expr("a", "Exists", &["x"])).field,
            "spec.podSelector.matchExpressions[0].values"
        );
    }
}
