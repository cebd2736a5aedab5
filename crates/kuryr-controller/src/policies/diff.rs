//! Desired vs actual Neutron state of one policy -> the operations that make them equal.
//!
//! Order matters for safety: what is removed goes before what is added (a policy update never
//! allows the union of old and new for a moment), address groups exist before the rules that
//! point at them and go after them.

use std::collections::{BTreeMap, BTreeSet};

use super::cidr::Cidr;
use super::desired::{AgKey, DesiredPolicy, Rule};

/// A policy security group as Neutron has it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ActualGroup {
    pub id: String,
    /// (rule id, rule); a rule pointing at an address group that is not the policy's has
    /// [`super::Remote::Foreign`].
    pub rules: Vec<(String, Rule)>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ActualPolicy {
    /// By variant.
    pub groups: BTreeMap<String, ActualGroup>,
    /// By key: (id, addresses).
    pub address_groups: BTreeMap<AgKey, (String, BTreeSet<Cidr>)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    CreateGroup {
        variant: String,
    },
    CreateAddressGroup {
        key: AgKey,
        addresses: Vec<Cidr>,
    },
    DeleteRule {
        variant: String,
        id: String,
    },
    RemoveAddresses {
        key: AgKey,
        id: String,
        addresses: Vec<Cidr>,
    },
    AddAddresses {
        key: AgKey,
        id: String,
        addresses: Vec<Cidr>,
    },
    CreateRule {
        variant: String,
        rule: Rule,
    },
    DeleteAddressGroup {
        key: AgKey,
        id: String,
    },
    DeleteGroup {
        variant: String,
        id: String,
    },
}

impl Op {
    fn rank(&self) -> u8 {
        match self {
            Op::CreateGroup { .. } => 0,
            Op::CreateAddressGroup { .. } => 1,
            Op::DeleteRule { .. } => 2,
            Op::RemoveAddresses { .. } => 3,
            Op::AddAddresses { .. } => 4,
            Op::CreateRule { .. } => 5,
            // A group goes with its rules; an address group is refused while a rule names it
            // (409 AddressGroupInUse), and a group no longer wanted keeps its rules to the end.
            Op::DeleteGroup { .. } => 6,
            Op::DeleteAddressGroup { .. } => 7,
        }
    }
}

/// The operations turning `actual` into `desired`; empty when they already match.
pub fn diff(desired: &DesiredPolicy, actual: &ActualPolicy) -> Vec<Op> {
    let mut ops = vec![];
    for (key, want) in &desired.address_groups {
        match actual.address_groups.get(key) {
            None => ops.push(Op::CreateAddressGroup {
                key: key.clone(),
                addresses: want.iter().copied().collect(),
            }),
            Some((id, have)) => {
                let remove: Vec<Cidr> = have.difference(want).copied().collect();
                let add: Vec<Cidr> = want.difference(have).copied().collect();
                if !remove.is_empty() {
                    ops.push(Op::RemoveAddresses {
                        key: key.clone(),
                        id: id.clone(),
                        addresses: remove,
                    });
                }
                if !add.is_empty() {
                    ops.push(Op::AddAddresses {
                        key: key.clone(),
                        id: id.clone(),
                        addresses: add,
                    });
                }
            }
        }
    }
    for (key, (id, _)) in &actual.address_groups {
        if !desired.address_groups.contains_key(key) {
            ops.push(Op::DeleteAddressGroup {
                key: key.clone(),
                id: id.clone(),
            });
        }
    }
    for (variant, want) in &desired.groups {
        let have = actual.groups.get(variant);
        if have.is_none() {
            ops.push(Op::CreateGroup {
                variant: variant.clone(),
            });
        }
        let mut kept: BTreeSet<&Rule> = BTreeSet::new();
        for (id, rule) in have.map(|g| g.rules.as_slice()).unwrap_or_default() {
            // A duplicate of a kept rule goes too.
            if want.contains(rule) && kept.insert(rule) {
                continue;
            }
            ops.push(Op::DeleteRule {
                variant: variant.clone(),
                id: id.clone(),
            });
        }
        for rule in want.iter().filter(|r| !kept.contains(r)) {
            ops.push(Op::CreateRule {
                variant: variant.clone(),
                rule: rule.clone(),
            });
        }
    }
    for (variant, g) in &actual.groups {
        if !desired.groups.contains_key(variant) {
            ops.push(Op::DeleteGroup {
                variant: variant.clone(),
                id: g.id.clone(),
            });
        }
    }
    ops.sort_by_key(Op::rank);
    ops
}
