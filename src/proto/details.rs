//! `ConnectionDetails`, decoded from either southbound revision. SLIM
//! 2.0.0-alpha.2 carries `SpireMtls spire_mtls = 3` and `Struct metadata =
//! 4`; the 3.x line reuses those numbers with other wire types (`bool
//! tls_required = 3`, `AuthMethod auth_method = 4`) and moves on to
//! `spire_trust_domain = 5` and `Struct metadata = 6`. A generated decoder
//! for one revision refuses the other's message outright, and a node whose
//! registration fails to decode gives up for good; so this type is written
//! by hand: it tells the revisions apart by wire type, keeps what either
//! sends, and encodes in the form it is given: a node's own revision, or
//! the common form both revisions decode (for callers whose revision
//! cannot be told, see [`Form::Common`]).

use prost::bytes::{Buf, BufMut};
use prost::encoding::{self, DecodeContext, WireType};
use prost::{DecodeError, Message};

pub use crate::revision::Revision;

/// How a `ConnectionDetails` is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Form {
    /// 2.0.0-alpha.2: `spire_mtls = 3`, `metadata = 4`.
    #[default]
    V2,
    /// 3.x: `tls_required = 3`, `auth_method = 4`, `spire_trust_domain =
    /// 5`, `metadata = 6`.
    V3,
    /// Only the fields neither revision misreads: 1 and 2, which both
    /// share, and 5 and 6, which a 2.0.0-alpha.2 decoder skips as unknown.
    /// Fields 3 and 4 are left out: whichever revision's meaning they
    /// carried, a decoder of the other refuses the whole message. A 3.x
    /// reader sees `tls_required: false` and `AUTH_METHOD_NONE` there; a
    /// 2.0.0-alpha.2 reader sees no SPIRE settings and no metadata.
    Common,
}

impl From<Revision> for Form {
    fn from(r: Revision) -> Form {
        match r {
            Revision::V2 => Form::V2,
            Revision::V3 => Form::V3,
        }
    }
}

pub mod connection_details {
    /// The 2.0.0-alpha.2 SPIRE mTLS settings of a listener.
    #[derive(Clone, PartialEq, Eq, prost::Message)]
    pub struct SpireMtls {
        #[prost(string, tag = "1")]
        pub socket_path: String,
        #[prost(string, optional, tag = "2")]
        pub trust_domain: Option<String>,
    }
}

/// One data-plane listener of a node.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ConnectionDetails {
    pub endpoint: String,
    pub external_endpoint: Option<String>,
    /// 2.0.0-alpha.2 only.
    pub spire_mtls: Option<connection_details::SpireMtls>,
    /// Field 4 in 2.0.0-alpha.2, field 6 in 3.x.
    pub metadata: Option<prost_types::Struct>,
    /// 3.x only.
    pub tls_required: bool,
    /// 3.x only: the `AuthMethod` enum's number.
    pub auth_method: i32,
    /// 3.x only.
    pub spire_trust_domain: Option<String>,
    /// The form it was read in (2.0.0-alpha.2 unless a 3.x field came),
    /// and the form it is written in.
    pub form: Form,
}

impl ConnectionDetails {
    /// The revision of the node that sent it.
    pub fn revision(&self) -> Revision {
        match self.form {
            Form::V3 => Revision::V3,
            Form::V2 | Form::Common => Revision::V2,
        }
    }

    /// Metadata's field number in this form.
    fn metadata_tag(&self) -> u32 {
        match self.form {
            Form::V2 => 4,
            Form::V3 | Form::Common => 6,
        }
    }

    /// The 3.x fields this form writes: 3 and 4 only in 3.x itself.
    fn writes_tls_and_auth(&self) -> bool {
        self.form == Form::V3
    }
}

impl Message for ConnectionDetails {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if !self.endpoint.is_empty() {
            encoding::string::encode(1, &self.endpoint, buf);
        }
        if let Some(e) = &self.external_endpoint {
            encoding::string::encode(2, e, buf);
        }
        match self.form {
            Form::V2 => {
                if let Some(s) = &self.spire_mtls {
                    encoding::message::encode(3, s, buf);
                }
            }
            Form::V3 | Form::Common => {
                if self.writes_tls_and_auth() && self.tls_required {
                    encoding::bool::encode(3, &self.tls_required, buf);
                }
                if self.writes_tls_and_auth() && self.auth_method != 0 {
                    encoding::int32::encode(4, &self.auth_method, buf);
                }
                if let Some(t) = &self.spire_trust_domain {
                    encoding::string::encode(5, t, buf);
                }
            }
        }
        if let Some(m) = &self.metadata {
            encoding::message::encode(self.metadata_tag(), m, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        use WireType::{LengthDelimited as Len, Varint};
        if matches!((tag, wire_type), (3 | 4, Varint) | (5 | 6, _)) {
            self.form = Form::V3;
        }
        match (tag, wire_type) {
            (1, _) => encoding::string::merge(wire_type, &mut self.endpoint, buf, ctx),
            (2, _) => {
                let e = self.external_endpoint.get_or_insert_with(String::new);
                encoding::string::merge(wire_type, e, buf, ctx)
            }
            (3, Len) => {
                let s = self.spire_mtls.get_or_insert_with(Default::default);
                encoding::message::merge(wire_type, s, buf, ctx)
            }
            (3, _) => encoding::bool::merge(wire_type, &mut self.tls_required, buf, ctx),
            (4, Len) | (6, _) => {
                let m = self.metadata.get_or_insert_with(Default::default);
                encoding::message::merge(wire_type, m, buf, ctx)
            }
            (4, _) => encoding::int32::merge(wire_type, &mut self.auth_method, buf, ctx),
            (5, _) => {
                let t = self.spire_trust_domain.get_or_insert_with(String::new);
                encoding::string::merge(wire_type, t, buf, ctx)
            }
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let mut len = 0;
        if !self.endpoint.is_empty() {
            len += encoding::string::encoded_len(1, &self.endpoint);
        }
        if let Some(e) = &self.external_endpoint {
            len += encoding::string::encoded_len(2, e);
        }
        len += match self.form {
            Form::V2 => self
                .spire_mtls
                .as_ref()
                .map_or(0, |s| encoding::message::encoded_len(3, s)),
            Form::V3 | Form::Common => {
                let tls = match self.writes_tls_and_auth() && self.tls_required {
                    true => encoding::bool::encoded_len(3, &true),
                    false => 0,
                };
                let auth = match self.auth_method {
                    a if a != 0 && self.writes_tls_and_auth() => {
                        encoding::int32::encoded_len(4, &a)
                    }
                    _ => 0,
                };
                let td = self
                    .spire_trust_domain
                    .as_ref()
                    .map_or(0, |t| encoding::string::encoded_len(5, t));
                tls + auth + td
            }
        };
        len + self.metadata.as_ref().map_or(0, |m| {
            encoding::message::encoded_len(self.metadata_tag(), m)
        })
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost_types::{Struct, Value, value::Kind};

    fn metadata() -> Struct {
        let v = Value {
            kind: Some(Kind::StringValue("a.example:46357".into())),
        };
        Struct {
            fields: [("external_endpoint".to_string(), v)].into(),
        }
    }

    /// The bytes a 3.x node sends, written field by field.
    fn v3_bytes(td: &str) -> Vec<u8> {
        let mut buf = Vec::new();
        encoding::string::encode(1, &"0.0.0.0:46357".to_string(), &mut buf);
        encoding::bool::encode(3, &true, &mut buf);
        encoding::int32::encode(4, &2, &mut buf);
        encoding::string::encode(5, &td.to_string(), &mut buf);
        encoding::message::encode(6, &metadata(), &mut buf);
        buf
    }

    #[test]
    fn a_3x_listener_is_read_whole_and_written_back_the_same() {
        let bytes = v3_bytes("edge.example");
        let d = ConnectionDetails::decode(bytes.as_slice()).expect("decodes");
        assert_eq!(d.revision(), Revision::V3);
        assert!(d.tls_required);
        assert_eq!(d.auth_method, 2);
        assert_eq!(d.spire_trust_domain.as_deref(), Some("edge.example"));
        assert_eq!(d.metadata, Some(metadata()));
        assert_eq!(d.spire_mtls, None);
        assert_eq!(d.encode_to_vec(), bytes);
        assert_eq!(d.encoded_len(), bytes.len());
    }

    #[test]
    fn a_2x_listener_keeps_its_revision_and_fields() {
        let d = ConnectionDetails {
            endpoint: "0.0.0.0:46357".into(),
            external_endpoint: Some("n.example:46357".into()),
            spire_mtls: Some(connection_details::SpireMtls {
                socket_path: "/run/spire.sock".into(),
                trust_domain: Some("td".into()),
            }),
            metadata: Some(metadata()),
            ..Default::default()
        };
        let bytes = d.encode_to_vec();
        assert_eq!(bytes.len(), d.encoded_len());
        let back = ConnectionDetails::decode(bytes.as_slice()).expect("decodes");
        assert_eq!(back, d);
        assert_eq!(back.revision(), Revision::V2);
    }

    #[test]
    fn unknown_fields_are_skipped() {
        let mut bytes = v3_bytes("td");
        encoding::string::encode(42, &"later".to_string(), &mut bytes);
        let d = ConnectionDetails::decode(bytes.as_slice()).expect("decodes");
        assert_eq!(d.spire_trust_domain.as_deref(), Some("td"));
    }
}
