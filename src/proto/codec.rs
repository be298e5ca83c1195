//! The gRPC codec of every service: prost's, with a smaller first buffer.
//!
//! tonic gives each call an 8 KiB decode buffer and an 8 KiB encode buffer
//! up front, and keeps them for the life of the call. A node's control
//! stream lives as long as the node, and almost all it carries are
//! messages of a few hundred bytes, so at 10,000 nodes those two buffers
//! alone were most of a replica's memory. They start at [`BUFFER_BYTES`]
//! here and grow (as tonic's do) for a message that needs more.

use std::marker::PhantomData;

use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// First capacity of each call's encode and decode buffer: an ack or a
/// small command fits; a larger message grows it once, as it would grow
/// tonic's 8 KiB for a message over that.
pub const BUFFER_BYTES: usize = 256;

/// Encoded bytes gathered before they are handed to HTTP/2 (tonic's
/// default): only reached by a burst of messages queued at once.
const YIELD_THRESHOLD: usize = 32 * 1024;

/// prost's codec with [`BUFFER_BYTES`] buffers (named by `build.rs`).
#[derive(Debug, Clone)]
pub struct LeanCodec<T, U> {
    _pd: PhantomData<(T, U)>,
}

impl<T, U> Default for LeanCodec<T, U> {
    fn default() -> Self {
        Self { _pd: PhantomData }
    }
}

fn settings() -> BufferSettings {
    BufferSettings::new(BUFFER_BYTES, YIELD_THRESHOLD)
}

impl<T, U> Codec for LeanCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(settings())
    }
}
