//! Transport behaviour that needs no server: connection failures are typed, retried with backoff, and reported.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kuryr_neutron::{ClientOptions, Error, ListFilter, NeutronClient, Outcome, PortCreate};

#[tokio::test]
async fn refused_connections_are_retried_then_typed() {
    // A port that was just free: nothing listens there.
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let a2 = attempts.clone();
    let mut opts = ClientOptions::noauth(format!("http://{addr}"));
    opts.max_attempts = 3;
    opts.retry_base_delay = Duration::from_millis(5);
    opts.retry_max_delay = Duration::from_millis(20);
    let client = NeutronClient::with_metrics(
        &opts,
        Arc::new(move |c: &kuryr_neutron::CallRecord<'_>| {
            if let Ok(mut v) = a2.lock() {
                v.push((c.operation.to_owned(), c.outcome, c.attempts));
            }
        }),
    )
    .expect("client");
    let err = client
        .list_ports(&ListFilter::new())
        .await
        .expect_err("nothing listens");
    assert!(
        matches!(
            err,
            Error::Connection {
                operation: "list_ports",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.is_transient());
    // A POST whose connection was refused never reached a server: retried as well.
    let err = client
        .create_port(&PortCreate::new("n"))
        .await
        .expect_err("refused");
    assert!(
        matches!(
            err,
            Error::Connection {
                operation: "create_port",
                ..
            }
        ),
        "{err:?}"
    );
    let seen = attempts.lock().expect("metrics").clone();
    assert_eq!(
        seen,
        vec![
            ("list_ports".to_owned(), Outcome::TransportError, 3),
            ("create_port".to_owned(), Outcome::TransportError, 3)
        ]
    );
}

#[tokio::test]
async fn invalid_options_are_rejected_with_the_field_name() {
    let mut o = ClientOptions::noauth("http://127.0.0.1:1");
    o.max_concurrent_requests = 0;
    let e = NeutronClient::new(&o).expect_err("zero concurrency");
    assert!(e.to_string().contains("max_concurrent_requests"), "{e}");
    let e = NeutronClient::new(&ClientOptions::noauth("not a url")).expect_err("bad endpoint");
    assert!(e.to_string().contains("endpoint_override"), "{e}");
    let mut o = ClientOptions::noauth("http://127.0.0.1:1");
    o.cafile = Some("/nonexistent/ca.pem".into());
    let e = NeutronClient::new(&o).expect_err("missing cafile");
    assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
}
