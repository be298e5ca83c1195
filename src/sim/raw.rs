//! A southbound stream that carries raw bytes inside valid gRPC framing, so
//! tests and the fuzzer can put anything on the wire, garbage included,
//! and see what the control plane answers, byte for byte.

use bytes::{Buf, BufMut};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;

/// Message bytes in, message bytes out, unchanged.
#[derive(Debug, Default)]
pub struct RawCodec;

#[derive(Debug)]
pub struct RawEncoder;

#[derive(Debug)]
pub struct RawDecoder;

impl Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Self::Error> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Self::Error> {
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

/// Opens `OpenControlChannel` on `channel`, sending what `outbound` yields;
/// returns the control plane's messages as bytes.
pub async fn open_raw(
    channel: Channel,
    outbound: mpsc::Receiver<Vec<u8>>,
) -> Result<tonic::Streaming<Vec<u8>>, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/controller.proto.v1.ControllerService/OpenControlChannel",
    );
    let request = tonic::Request::new(ReceiverStream::new(outbound));
    Ok(grpc.streaming(request, path, RawCodec).await?.into_inner())
}
