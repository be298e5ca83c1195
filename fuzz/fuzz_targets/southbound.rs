//! Coverage-guided fuzzing of the southbound: the input is a sequence of
//! raw frames sent on one `OpenControlChannel` stream of a real replica
//! (memory store, loopback gRPC), so the server's own decoding, the
//! handshake and the fact paths all see the bytes. A panic anywhere in the
//! replica aborts the process, which is what the fuzzer catches; every so
//! often a canary node must still register.
//!
//! Input: byte 0's low bit asks for a valid registration first (so the
//! fuzzer reaches a registered session's paths at once); then frames, each
//! a little-endian u16 length and that many bytes.

#![no_main]

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use prost::Message;
use slim_cp::proto::sb;
use slim_cp::proto::sb::control_message::Payload;
use slim_cp::server::{self, Options, Running};
use slim_cp::sim::raw::open_raw;
use slim_cp::store::MemoryStore;
use tokio::runtime::Runtime;
use tokio::sync::mpsc;
use tonic::transport::Channel;

struct Harness {
    rt: Runtime,
    channel: Channel,
    // Kept so the replica lives as long as the process.
    _running: Running,
}

fn harness() -> &'static Harness {
    static H: OnceLock<Harness> = OnceLock::new();
    H.get_or_init(|| {
        std::panic::set_hook(Box::new(|info| {
            eprintln!("{info}");
            std::process::abort();
        }));
        let rt = Runtime::new().expect("a runtime");
        let (running, channel) = rt.block_on(async {
            let store = std::sync::Arc::new(MemoryStore::new());
            let mut opts = Options::loopback();
            opts.register_timeout = Duration::from_millis(200);
            let running = server::start(opts, store).await.expect("replica starts");
            let url = format!("http://{}", running.southbound_addr);
            let channel = Channel::from_shared(url)
                .expect("a URL")
                .connect()
                .await
                .expect("connects");
            (running, channel)
        });
        Harness {
            rt,
            channel,
            _running: running,
        }
    })
}

/// Few node ids, so the store does not grow with the run.
fn register(seq: u64) -> Vec<u8> {
    sb::ControlMessage {
        message_id: format!("r{seq}"),
        payload: Some(Payload::RegisterNodeRequest(sb::RegisterNodeRequest {
            node_id: format!("n{}", seq % 16),
            group_name: Some("fuzz".into()),
            ..Default::default()
        })),
    }
    .encode_to_vec()
}

fn frames(mut data: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while data.len() >= 2 {
        let len = usize::from(u16::from_le_bytes([data[0], data[1]]));
        data = &data[2..];
        let take = len.min(data.len());
        out.push(data[..take].to_vec());
        data = &data[take..];
    }
    out
}

/// Sends `msgs` on one stream and reads until the server ends it; returns
/// the first reply, if any.
async fn exchange(channel: Channel, msgs: Vec<Vec<u8>>) -> Option<Vec<u8>> {
    let (tx, rx) = mpsc::channel(msgs.len().max(1));
    for m in msgs {
        tx.send(m).await.ok()?;
    }
    drop(tx);
    let mut inbound = open_raw(channel, rx).await.ok()?;
    let first = inbound.message().await.ok().flatten();
    // The rest until the end (bounded: an idle registered stream lasts).
    let _ = tokio::time::timeout(Duration::from_millis(50), async {
        while let Ok(Some(_)) = inbound.message().await {}
    })
    .await;
    first
}

fn canary_registers(h: &Harness, seq: u64) {
    let reply = h.rt.block_on(exchange(h.channel.clone(), vec![register(seq)]));
    let ok = reply
        .and_then(|b| sb::ControlMessage::decode(b.as_slice()).ok())
        .is_some_and(|m| matches!(m.payload, Some(Payload::RegisterNodeResponse(r)) if r.success));
    assert!(ok, "the replica stopped answering registrations");
}

fuzz_target!(|data: &[u8]| {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let h = harness();
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut msgs = Vec::new();
    if flags & 1 == 1 {
        msgs.push(register(seq));
    }
    msgs.extend(frames(rest));
    h.rt.block_on(exchange(h.channel.clone(), msgs));
    if seq % 500 == 0 {
        canary_registers(h, seq);
    }
});
