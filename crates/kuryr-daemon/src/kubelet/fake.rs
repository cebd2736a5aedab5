//! A fake kubelet PodResources server for the tests: HTTP/2 gRPC on
//! `<tempdir>/pod-resources/kubelet.sock`, a fixed answer per method.

use std::collections::HashMap;
use std::convert::Infallible;
use std::path::Path;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::BodyExt as _;
use http_body_util::StreamBody;
use http_body_util::combinators::BoxBody;
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};

use super::pod_resources::{GRPC_UNIMPLEMENTED, SOCKET_IN_ROOT_DIR};
use super::proto::{ContainerDevices, ContainerResources, PodResources, encode};

#[derive(Clone, Debug)]
pub(crate) enum Answer {
    /// A `ListPodResourcesResponse` with these pods, status OK.
    Pods(Vec<PodResources>),
    /// A non-OK status: in the headers (trailers-only, how grpc-go answers
    /// errors) or in trailers after headers.
    Status {
        code: u32,
        message: String,
        trailers_only: bool,
    },
    /// This body as is, then status OK.
    Body(Vec<u8>),
    /// Never answers.
    Hang,
}

pub(crate) struct FakeKubelet {
    dir: tempfile::TempDir,
    calls: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Body = BoxBody<Bytes, Infallible>;

fn response(status: u32, message: &str, trailers_only: bool, data: Option<Vec<u8>>) -> hyper::Response<Body> {
    let mut grpc = http::HeaderMap::new();
    grpc.insert("grpc-status", http::HeaderValue::from(status));
    if !message.is_empty() {
        // Percent-encoded, as gRPC servers send it.
        let encoded: String = message
            .bytes()
            .map(|b| {
                if (0x20..0x7f).contains(&b) && b != b'%' {
                    char::from(b).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        grpc.insert(
            "grpc-message",
            http::HeaderValue::from_str(&encoded).unwrap_or(http::HeaderValue::from_static("?")),
        );
    }
    let mut builder = hyper::Response::builder()
        .status(200)
        .header(http::header::CONTENT_TYPE, "application/grpc");
    if trailers_only {
        for (k, v) in &grpc {
            builder = builder.header(k, v);
        }
        let body = StreamBody::new(futures::stream::iter(
            Vec::<Result<Frame<Bytes>, Infallible>>::new(),
        ));
        return builder.body(body.boxed()).unwrap_or_default();
    }
    let mut frames = Vec::new();
    if let Some(data) = data {
        frames.push(Ok(Frame::data(Bytes::from(data))));
    }
    frames.push(Ok(Frame::trailers(grpc)));
    builder
        .body(StreamBody::new(futures::stream::iter(frames)).boxed())
        .unwrap_or_default()
}

fn framed(message: Vec<u8>) -> Vec<u8> {
    let mut out = vec![0];
    out.extend_from_slice(&u32::try_from(message.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend(message);
    out
}

impl FakeKubelet {
    /// Serves `answers` by gRPC method path; other methods are UNIMPLEMENTED.
    pub async fn start(answers: HashMap<&'static str, Answer>) -> Self {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let socket = dir.path().join(SOCKET_IN_ROOT_DIR);
        if let Some(parent) = socket.parent() {
            std::fs::create_dir_all(parent).unwrap_or_else(|e| panic!("{}: {e}", parent.display()));
        }
        let listener =
            tokio::net::UnixListener::bind(&socket).unwrap_or_else(|e| panic!("{}: {e}", socket.display()));
        let calls = Arc::new(Mutex::new(Vec::new()));
        let answers = Arc::new(answers);
        let seen = calls.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let answers = answers.clone();
                let seen = seen.clone();
                let service =
                    hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let answers = answers.clone();
                        let seen = seen.clone();
                        async move {
                            let path = req.uri().path().to_string();
                            seen.lock().unwrap_or_else(|p| p.into_inner()).push(path.clone());
                            let resp = match answers.get(path.as_str()).cloned() {
                                None => response(
                                    GRPC_UNIMPLEMENTED,
                                    &format!("unknown method {path}"),
                                    true,
                                    None,
                                ),
                                Some(Answer::Pods(pods)) => {
                                    response(0, "", false, Some(framed(encode::list_response(&pods))))
                                }
                                Some(Answer::Status {
                                    code,
                                    message,
                                    trailers_only,
                                }) => response(code, &message, trailers_only, None),
                                Some(Answer::Body(body)) => response(0, "", false, Some(body)),
                                Some(Answer::Hang) => {
                                    tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
                                    response(0, "", false, None)
                                }
                            };
                            Ok::<_, Infallible>(resp)
                        }
                    });
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { dir, calls, task }
    }

    /// What to configure as `[sriov] kubelet_root_dir`.
    pub fn root_dir(&self) -> &Path {
        self.dir.path()
    }

    /// The gRPC methods called so far, in order.
    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Pod `ns/name` with one container holding `devices` as (resource, device ids).
pub(crate) fn pod_with(ns: &str, name: &str, devices: &[(&str, &[&str])]) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: ns.into(),
        containers: vec![ContainerResources {
            name: "app".into(),
            devices: devices
                .iter()
                .map(|(r, ids)| ContainerDevices {
                    resource_name: (*r).into(),
                    device_ids: ids.iter().map(|s| (*s).to_string()).collect(),
                })
                .collect(),
        }],
    }
}
