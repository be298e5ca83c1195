//! A scripted control plane for the simulator's end-to-end tests: it hands
//! every opened stream to the test, and can die like a killed process
//! (listener closed, every TCP connection shut down).

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use slim_cp::proto::sb;
use slim_cp::proto::sb::control_message::Payload;
use slim_cp::proto::sb::controller_service_server::{ControllerService, ControllerServiceServer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::{ReceiverStream, UnboundedReceiverStream};
use tonic::{Request, Response, Status, Streaming};

pub const WAIT: Duration = Duration::from_secs(5);

type Out = mpsc::Sender<Result<sb::ControlMessage, Status>>;

/// One node stream as the scripted server sees it.
pub struct CpStream {
    pub inbound: Streaming<sb::ControlMessage>,
    pub out: Out,
}

struct Svc {
    streams: mpsc::UnboundedSender<CpStream>,
    reject_open: Arc<AtomicBool>,
}

#[tonic::async_trait]
impl ControllerService for Svc {
    type OpenControlChannelStream = ReceiverStream<Result<sb::ControlMessage, Status>>;

    async fn open_control_channel(
        &self,
        request: Request<Streaming<sb::ControlMessage>>,
    ) -> Result<Response<Self::OpenControlChannelStream>, Status> {
        if self.reject_open.load(Ordering::SeqCst) {
            return Err(Status::unavailable("scripted refusal"));
        }
        let (out, rx) = mpsc::channel(4096);
        let _ = self.streams.send(CpStream {
            inbound: request.into_inner(),
            out,
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// The scripted control plane.
pub struct ScriptedCp {
    pub addr: SocketAddr,
    pub reject_open: Arc<AtomicBool>,
    streams: Option<mpsc::UnboundedReceiver<CpStream>>,
    sockets: Arc<Mutex<Vec<std::net::TcpStream>>>,
    tasks: Vec<JoinHandle<()>>,
}

impl ScriptedCp {
    pub async fn start() -> ScriptedCp {
        Self::start_on("127.0.0.1:0".parse().unwrap()).await
    }

    pub async fn start_on(addr: SocketAddr) -> ScriptedCp {
        let listener = TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let sockets = Arc::new(Mutex::new(Vec::new()));
        let (conn_tx, conn_rx) = mpsc::unbounded_channel::<Result<TcpStream, std::io::Error>>();
        let kept = sockets.clone();
        let accept = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let std = tcp.into_std().unwrap();
                kept.lock().unwrap().push(std.try_clone().unwrap());
                let _ = conn_tx.send(Ok(TcpStream::from_std(std).unwrap()));
            }
        });
        let (streams_tx, streams_rx) = mpsc::unbounded_channel();
        let reject_open = Arc::new(AtomicBool::new(false));
        let svc = Svc {
            streams: streams_tx,
            reject_open: reject_open.clone(),
        };
        let server = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(ControllerServiceServer::new(svc))
                .serve_with_incoming(UnboundedReceiverStream::new(conn_rx))
                .await;
        });
        ScriptedCp {
            addr,
            reject_open,
            streams: Some(streams_rx),
            sockets,
            tasks: vec![accept, server],
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn next_stream(&mut self) -> CpStream {
        let streams = self.streams.as_mut().expect("streams taken by auto mode");
        tokio::time::timeout(WAIT, streams.recv())
            .await
            .expect("no stream opened in time")
            .expect("server gone")
    }

    /// Whether a stream opens within `wait`.
    pub async fn stream_within(&mut self, wait: Duration) -> Option<CpStream> {
        let streams = self.streams.as_mut()?;
        tokio::time::timeout(wait, streams.recv())
            .await
            .ok()
            .flatten()
    }

    /// Answers every registration with success and holds the streams;
    /// returns the handle that can end them all.
    pub fn auto_register(&mut self) -> AutoCp {
        let mut streams = self.streams.take().expect("already in auto mode");
        let held: Arc<Mutex<Vec<Out>>> = Arc::default();
        let registrations = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (h, r) = (held.clone(), registrations.clone());
        self.tasks.push(tokio::spawn(async move {
            while let Some(mut s) = streams.recv().await {
                let (h, r) = (h.clone(), r.clone());
                tokio::spawn(async move {
                    let Some((id, _)) = s.try_register().await else {
                        return;
                    };
                    s.respond_register(&id, true, vec![], vec![]).await;
                    r.fetch_add(1, Ordering::SeqCst);
                    h.lock().unwrap().push(s.out.clone());
                    drop(s.out);
                    while let Ok(Some(_)) = s.inbound.message().await {}
                });
            }
        }));
        AutoCp {
            held,
            registrations,
        }
    }

    /// Dies like a killed process: stops listening, resets every connection.
    pub fn kill(&mut self) {
        for task in self.tasks.drain(..) {
            task.abort();
        }
        for socket in self.sockets.lock().unwrap().drain(..) {
            let _ = socket.shutdown(std::net::Shutdown::Both);
        }
    }
}

impl Drop for ScriptedCp {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Handle on an auto-registering control plane.
pub struct AutoCp {
    held: Arc<Mutex<Vec<Out>>>,
    pub registrations: Arc<std::sync::atomic::AtomicUsize>,
}

impl AutoCp {
    /// Ends every held stream cleanly (the control plane closed them).
    pub fn end_streams(&self) {
        self.held.lock().unwrap().clear();
    }

    pub fn count(&self) -> usize {
        self.registrations.load(Ordering::SeqCst)
    }
}

impl CpStream {
    pub async fn recv(&mut self) -> sb::ControlMessage {
        let next = tokio::time::timeout(WAIT, self.inbound.message()).await;
        next.expect("no message in time")
            .expect("stream error")
            .expect("stream ended")
    }

    /// The next message, or `None` when nothing comes within `wait`.
    pub async fn recv_within(&mut self, wait: Duration) -> Option<sb::ControlMessage> {
        let next = tokio::time::timeout(wait, self.inbound.message()).await;
        next.ok().and_then(|r| r.ok()).flatten()
    }

    /// Expects `RegisterNodeRequest` as the first message.
    pub async fn register(&mut self) -> (String, sb::RegisterNodeRequest) {
        self.try_register()
            .await
            .expect("first message is not RegisterNodeRequest")
    }

    pub async fn try_register(&mut self) -> Option<(String, sb::RegisterNodeRequest)> {
        let msg = tokio::time::timeout(WAIT, self.inbound.message())
            .await
            .ok()?
            .ok()??;
        match msg.payload {
            Some(Payload::RegisterNodeRequest(req)) => Some((msg.message_id, req)),
            _ => None,
        }
    }

    pub async fn send(&self, payload: Payload) -> String {
        let id = uuid::Uuid::new_v4().to_string();
        let msg = sb::ControlMessage {
            message_id: id.clone(),
            payload: Some(payload),
        };
        self.out.send(Ok(msg)).await.expect("stream gone");
        id
    }

    pub async fn respond_register(
        &self,
        original: &str,
        success: bool,
        connections: Vec<sb::Connection>,
        routes: Vec<sb::Route>,
    ) {
        let resp = sb::RegisterNodeResponse {
            original_message_id: original.to_string(),
            success,
            connections,
            routes,
        };
        self.send(Payload::RegisterNodeResponse(resp)).await;
    }

    /// Receives until a `ConfigurationCommandAck` comes.
    pub async fn ack(&mut self) -> sb::ConfigurationCommandAck {
        loop {
            if let Some(Payload::ConfigCommandAck(ack)) = self.recv().await.payload {
                return ack;
            }
        }
    }

    /// Receives until a `ConfigurationCommand` comes.
    pub async fn command(&mut self) -> sb::ConfigurationCommand {
        loop {
            if let Some(Payload::ConfigCommand(cmd)) = self.recv().await.payload {
                return cmd;
            }
        }
    }
}

/// A free local port (bound, then released).
pub fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// Wire form of a remote link to `endpoint`.
pub fn link(id: &str, endpoint: &str) -> sb::Connection {
    sb::Connection {
        link_id: id.to_string(),
        config_data: format!(
            r#"{{"endpoint":"http://{endpoint}","link_id":"{id}","connection_type":"remote","tls":{{"insecure":true}}}}"#
        ),
    }
}
