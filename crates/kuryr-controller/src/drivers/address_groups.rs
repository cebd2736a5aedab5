//! Membership changes of a policy's Neutron address groups that hold up against other writers.
//!
//! Neutron's `add_addresses` and `remove_addresses` are all or nothing: one address already in
//! the group (`AddressesAlreadyExist`, 400) or already gone (`AddressesNotFound`, 404) refuses
//! the whole call. Both mean another writer got there first: the controller that led before a
//! leadership change, or an earlier call whose answer was lost and which the client, the action
//! not being idempotent, does not resend. The wanted end state is then partly there already, so
//! the group is read back and only what is still missing is sent.

use std::collections::BTreeSet;

use kuryr_neutron::{ErrorKind, NeutronClient};

use crate::error::Error;
use crate::policies::Cidr;

/// Makes every one of `addresses` a member of the address group `id` (`add`), or none of them.
/// A second refusal (the group keeps changing under this call) is ResourceNotReady: the policy's
/// next reconcile reads the group afresh.
pub async fn set_addresses(
    client: &NeutronClient,
    id: &str,
    addresses: &[Cidr],
    add: bool,
) -> Result<(), Error> {
    let raced = |e: &kuryr_neutron::Error| {
        e.kind()
            == Some(if add {
                &ErrorKind::AddressesAlreadyExist
            } else {
                &ErrorKind::AddressesNotFound
            })
    };
    match send(client, id, addresses, add).await {
        Ok(()) => return Ok(()),
        Err(e) if raced(&e) => {
            tracing::debug!(id, add, error = %e, "address group changed by another writer; reading it back");
        }
        Err(e) => return Err(e.into()),
    }
    let held: BTreeSet<Cidr> = client
        .get_address_group(id)
        .await?
        .addresses
        .iter()
        .filter_map(|a| a.parse().ok())
        .collect();
    let left: Vec<Cidr> = addresses
        .iter()
        .filter(|a| held.contains(a) != add)
        .copied()
        .collect();
    if left.is_empty() {
        return Ok(());
    }
    match send(client, id, &left, add).await {
        Err(e) if raced(&e) => Err(Error::not_ready(format!(
            "address group {id} keeps changing under its policy's reconcile: {e}"
        ))),
        r => r.map_err(Error::from),
    }
}

async fn send(
    client: &NeutronClient,
    id: &str,
    addresses: &[Cidr],
    add: bool,
) -> Result<(), kuryr_neutron::Error> {
    let a: Vec<String> = addresses.iter().map(ToString::to_string).collect();
    if add {
        client.add_addresses(id, &a).await.map(drop)
    } else {
        client.remove_addresses(id, &a).await.map(drop)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use kuryr_neutron::{AddressGroupCreate, ClientOptions};
    use neutron_emulator::{Emulator, EmulatorOptions};

    fn cidrs(list: &[&str]) -> Vec<Cidr> {
        list.iter().map(|a| a.parse().expect("test CIDR")).collect()
    }

    async fn members(client: &NeutronClient, id: &str) -> Vec<String> {
        client.get_address_group(id).await.unwrap().addresses
    }

    #[tokio::test]
    async fn a_membership_change_another_writer_made_in_part_is_completed_not_failed() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let emu = Emulator::start(EmulatorOptions::default()).await.unwrap();
        let client = NeutronClient::new(&ClientOptions::noauth(emu.url())).unwrap();
        let ag = client
            .create_address_group(&AddressGroupCreate {
                name: "peers".into(),
                project_id: Some("p".into()),
                description: Some("test".into()),
                addresses: vec!["10.0.0.1/32".into(), "10.0.0.2/32".into()],
            })
            .await
            .unwrap();

        // 10.0.0.3 was removed already by someone else: the rest still goes.
        set_addresses(&client, &ag.id, &cidrs(&["10.0.0.2/32", "10.0.0.3/32"]), false)
            .await
            .expect("a partly done removal completes");
        assert_eq!(members(&client, &ag.id).await, ["10.0.0.1/32"]);

        // 10.0.0.1 is in already: the other one is added.
        set_addresses(&client, &ag.id, &cidrs(&["10.0.0.1/32", "10.0.0.4/32"]), true)
            .await
            .expect("a partly done addition completes");
        assert_eq!(members(&client, &ag.id).await, ["10.0.0.1/32", "10.0.0.4/32"]);

        // Everything done already: nothing to send, no error.
        set_addresses(&client, &ag.id, &cidrs(&["10.0.0.9/32"]), false)
            .await
            .expect("an absent address is absent");
        assert_eq!(members(&client, &ag.id).await, ["10.0.0.1/32", "10.0.0.4/32"]);

        // Other failures are not mistaken for a race.
        let err = set_addresses(&client, "no-such-group", &cidrs(&["10.0.0.1/32"]), true)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("AddressGroupNotFound"), "{err}");
    }
}
