//! The Kafka protocol spoken directly, for the admin calls librdkafka does not have (KIP-664's
//! ListTransactions, DescribeTransactions and DescribeProducers, and WriteTxnMarkers).
//!
//! The messages are `kafka-protocol`'s, generated from Kafka's own schemas; this module only
//! frames them (a 4-byte size, the request header, the body), negotiates each API's version
//! with ApiVersions, and carries them over TCP, TLS (OpenSSL, as librdkafka and the
//! PostgreSQL client use) and SASL (PLAIN, and SCRAM-SHA-256 and SCRAM-SHA-512 with the
//! `scram` module). A connection is blocking and serves one request at a time: the callers
//! are operator commands and a slow background poll, not the data path.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, RequestHeader, ResponseHeader, SaslAuthenticateRequest,
    SaslHandshakeRequest,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use openssl::pkey::PKey;
use openssl::ssl::{SslConnector, SslMethod, SslStream, SslVerifyMode};

use super::scram::{Hash, Scram};

/// Why a request could not be carried out.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{addr}: {source}")]
    Io {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS with {addr}: {why}")]
    Tls { addr: String, why: String },
    /// The client settings ask for something this client cannot do, or are malformed.
    #[error("-X {key}: {why}")]
    Setting { key: String, why: String },
    #[error("SASL with {addr}: {why}")]
    Sasl { addr: String, why: String },
    /// The broker refused the credentials; its own words in `message`.
    #[error("SASL authentication failed with {addr} ({mechanism}): {message}")]
    SaslAuthentication {
        addr: String,
        mechanism: &'static str,
        message: String,
    },
    /// The broker does not serve the API at any version this client speaks.
    #[error("{addr} does not support {api:?} (needed: versions {ours}, broker: {theirs})")]
    Unsupported {
        addr: String,
        api: ApiKey,
        ours: String,
        theirs: String,
    },
    #[error("{addr}: {api:?}: cannot {what}: {why}")]
    Codec {
        addr: String,
        api: ApiKey,
        what: &'static str,
        why: String,
    },
}

/// librdkafka's security settings, as this client honours them: `security.protocol`
/// (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL), `ssl.ca.location`,
/// `ssl.certificate.location`, `ssl.key.location`, `ssl.key.password`,
/// `enable.ssl.certificate.verification`, `ssl.endpoint.identification.algorithm`, and for
/// SASL the PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 mechanisms with
/// `sasl.username`/`sasl.password`. Any other `ssl.*` or `sasl.*` setting, and any other
/// mechanism, is refused by name rather than ignored.
#[derive(Clone, Default)]
pub struct Security {
    tls: Option<Tls>,
    sasl: Option<Sasl>,
}

/// No `Debug`: it holds the password.
#[derive(Clone)]
struct Sasl {
    mechanism: Mechanism,
    user: String,
    password: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mechanism {
    Plain,
    Scram(Hash),
}

/// The mechanisms this client speaks, by name.
const MECHANISMS: [Mechanism; 3] = [
    Mechanism::Plain,
    Mechanism::Scram(Hash::Sha256),
    Mechanism::Scram(Hash::Sha512),
];

impl Mechanism {
    /// `PLAIN, SCRAM-SHA-256, SCRAM-SHA-512`: for messages.
    fn supported() -> String {
        MECHANISMS.map(Mechanism::name).join(", ")
    }

    fn name(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::Scram(hash) => hash.mechanism(),
        }
    }
}

#[derive(Clone, Default)]
struct Tls {
    ca: Option<String>,
    certificate: Option<String>,
    key: Option<String>,
    key_password: Option<String>,
    verify_certificate: bool,
    verify_hostname: bool,
}

impl std::fmt::Debug for Security {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Security")
            .field("tls", &self.tls.is_some())
            .field(
                "sasl",
                &self.sasl.as_ref().map(|s| (s.mechanism.name(), &s.user)),
            )
            .finish()
    }
}

impl Security {
    pub fn from_settings(settings: &[(String, String)]) -> Result<Security, WireError> {
        let get = |key: &str| {
            settings
                .iter()
                .rev()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
        };
        let bad = |key: &str, why: String| WireError::Setting {
            key: key.to_string(),
            why,
        };
        let flag = |key: &str, default: bool| match get(key).as_deref() {
            None => Ok(default),
            Some("true") => Ok(true),
            Some("false") => Ok(false),
            Some(other) => Err(bad(key, format!("`{other}` is not true or false"))),
        };
        const KNOWN: [&str; 10] = [
            "ssl.ca.location",
            "ssl.certificate.location",
            "ssl.key.location",
            "ssl.key.password",
            "enable.ssl.certificate.verification",
            "ssl.endpoint.identification.algorithm",
            "sasl.mechanism",
            "sasl.mechanisms",
            "sasl.username",
            "sasl.password",
        ];
        for (key, _) in settings {
            if (key.starts_with("ssl.") || key.starts_with("sasl."))
                && !KNOWN.contains(&key.as_str())
            {
                return Err(bad(
                    key,
                    format!(
                        "not supported by this command (supported: PLAINTEXT, SSL with PEM \
                         files, SASL with {})",
                        Mechanism::supported()
                    ),
                ));
            }
        }
        let protocol = get("security.protocol")
            .unwrap_or_else(|| "plaintext".into())
            .to_ascii_lowercase();
        let (tls, sasl) = match protocol.as_str() {
            "plaintext" => (false, false),
            "ssl" => (true, false),
            "sasl_plaintext" => (false, true),
            "sasl_ssl" => (true, true),
            other => {
                return Err(bad(
                    "security.protocol",
                    format!("`{other}` is not PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"),
                ));
            }
        };
        let tls = if tls {
            let hostname = match get("ssl.endpoint.identification.algorithm").as_deref() {
                None | Some("https") => true,
                Some("none") => false,
                Some(other) => {
                    return Err(bad(
                        "ssl.endpoint.identification.algorithm",
                        format!("`{other}` is not https or none"),
                    ));
                }
            };
            Some(Tls {
                ca: get("ssl.ca.location"),
                certificate: get("ssl.certificate.location"),
                key: get("ssl.key.location"),
                key_password: get("ssl.key.password"),
                verify_certificate: flag("enable.ssl.certificate.verification", true)?,
                verify_hostname: hostname,
            })
        } else {
            None
        };
        let sasl = if sasl {
            Some(sasl_settings(&get)?)
        } else {
            None
        };
        Ok(Security { tls, sasl })
    }
}

/// The SASL mechanism and credentials of SASL_PLAINTEXT and SASL_SSL.
fn sasl_settings(get: &impl Fn(&str) -> Option<String>) -> Result<Sasl, WireError> {
    let bad = |key: &str, why: String| WireError::Setting {
        key: key.to_string(),
        why,
    };
    let mechanism = get("sasl.mechanism")
        .or_else(|| get("sasl.mechanisms"))
        .unwrap_or_else(|| "GSSAPI".into());
    let Some(mechanism) = MECHANISMS.into_iter().find(|m| m.name() == mechanism) else {
        return Err(bad(
            "sasl.mechanism",
            format!(
                "`{mechanism}` is not supported by this command (supported: {})",
                Mechanism::supported()
            ),
        ));
    };
    let missing = |key: &str| bad(key, format!("missing for SASL/{}", mechanism.name()));
    let user = get("sasl.username").ok_or_else(|| missing("sasl.username"))?;
    let password = get("sasl.password").ok_or_else(|| missing("sasl.password"))?;
    Ok(Sasl {
        mechanism,
        user,
        password,
    })
}

trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

/// One broker connection, its API versions negotiated.
pub struct Connection {
    addr: String,
    stream: Box<dyn Stream>,
    next_correlation: i32,
    versions: HashMap<i16, (i16, i16)>,
}

const CLIENT_ID: &str = "onceflow-admin";

impl Connection {
    /// Connects to `host:port`, sets up TLS and SASL as `security` says, and asks the broker
    /// which API versions it serves.
    pub fn open(addr: &str, security: &Security, timeout: Duration) -> Result<Self, WireError> {
        let connect_err = |source| WireError::Connect {
            addr: addr.to_string(),
            source,
        };
        let socket = addr
            .to_socket_addrs()
            .map_err(connect_err)?
            .next()
            .ok_or_else(|| connect_err(std::io::Error::other("no address")))?;
        let tcp = TcpStream::connect_timeout(&socket, timeout).map_err(connect_err)?;
        tcp.set_read_timeout(Some(timeout)).map_err(connect_err)?;
        tcp.set_write_timeout(Some(timeout)).map_err(connect_err)?;
        tcp.set_nodelay(true).map_err(connect_err)?;
        let stream: Box<dyn Stream> = match &security.tls {
            None => Box::new(tcp),
            Some(tls) => Box::new(tls_connect(addr, tls, tcp)?),
        };
        let mut connection = Connection {
            addr: addr.to_string(),
            stream,
            next_correlation: 1,
            versions: HashMap::new(),
        };
        connection.negotiate()?;
        if let Some(sasl) = &security.sasl {
            connection.authenticate(sasl)?;
        }
        Ok(connection)
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    fn negotiate(&mut self) -> Result<(), WireError> {
        let request = ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("onceflow"))
            .with_client_software_version(StrBytes::from_static_str(env!("CARGO_PKG_VERSION")));
        // Version 3 is served by every broker since 2.4; the answer lists all the others.
        let response = self.call_at(&request, 3)?;
        if response.error_code != 0 {
            return Err(self.codec(
                ApiKey::ApiVersions,
                "negotiate",
                format!("error code {}", response.error_code),
            ));
        }
        self.versions = response
            .api_keys
            .iter()
            .map(|k| (k.api_key, (k.min_version, k.max_version)))
            .collect();
        Ok(())
    }

    /// SaslHandshake with the mechanism, then its SaslAuthenticate rounds: one for PLAIN,
    /// two for SCRAM (client-first and client-final), whose last answer proves that the broker
    /// knows the password too.
    fn authenticate(&mut self, sasl: &Sasl) -> Result<(), WireError> {
        let name = sasl.mechanism.name();
        let handshake = self.call(
            &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str(name)),
        )?;
        if handshake.error_code != 0 {
            let enabled: Vec<&str> = handshake.mechanisms.iter().map(|m| m.as_str()).collect();
            return Err(self.sasl(format!(
                "the broker does not enable {name} (error {}; it enables: {})",
                handshake.error_code,
                if enabled.is_empty() {
                    "none".to_string()
                } else {
                    enabled.join(", ")
                }
            )));
        }
        match sasl.mechanism {
            Mechanism::Plain => {
                let token = format!("\0{}\0{}", sasl.user, sasl.password);
                self.sasl_round(name, token.into_bytes())?;
            }
            Mechanism::Scram(hash) => {
                let mut scram = Scram::new(hash, &sasl.user, &sasl.password);
                let server_first = self.sasl_round(name, scram.client_first().into_bytes())?;
                let client_final = scram
                    .client_final(&server_first)
                    .map_err(|e| self.sasl(format!("{name}: {e}")))?;
                let server_final = self.sasl_round(name, client_final.into_bytes())?;
                scram
                    .verify_server_final(&server_final)
                    .map_err(|e| self.sasl(format!("{name}: {e}")))?;
            }
        }
        Ok(())
    }

    /// One SaslAuthenticate request; the broker's answer, or its refusal in its own words.
    fn sasl_round(&mut self, mechanism: &'static str, token: Vec<u8>) -> Result<Bytes, WireError> {
        let answer =
            self.call(&SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(token)))?;
        if answer.error_code != 0 {
            let message = answer
                .error_message
                .as_ref()
                .map(|m| m.as_str().to_string())
                .unwrap_or_default();
            return Err(WireError::SaslAuthentication {
                addr: self.addr.clone(),
                mechanism,
                message: format!("{message} (error {})", answer.error_code),
            });
        }
        Ok(answer.auth_bytes)
    }

    fn sasl(&self, why: String) -> WireError {
        WireError::Sasl {
            addr: self.addr.clone(),
            why,
        }
    }

    /// The highest version of `R` both sides speak.
    fn version<R: Request>(&self) -> Result<i16, WireError> {
        let api = api_key(R::KEY);
        let ours = R::VERSIONS;
        let (min, max) = self.versions.get(&R::KEY).copied().unwrap_or((0, -1));
        let version = ours.max.min(max);
        if version < ours.min.max(min) {
            return Err(WireError::Unsupported {
                addr: self.addr.clone(),
                api,
                ours: ours.to_string(),
                theirs: if max < 0 {
                    "none".into()
                } else {
                    format!("{min}..{max}")
                },
            });
        }
        Ok(version)
    }

    /// Sends one request at the highest version both sides speak and reads its response.
    pub fn call<R: Request>(&mut self, request: &R) -> Result<R::Response, WireError> {
        let version = self.version::<R>()?;
        self.call_at(request, version)
    }

    fn call_at<R: Request>(&mut self, request: &R, version: i16) -> Result<R::Response, WireError> {
        let api = api_key(R::KEY);
        let correlation = self.next_correlation;
        self.next_correlation = self.next_correlation.wrapping_add(1);
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(correlation)
            .with_client_id(Some(StrBytes::from_static_str(CLIENT_ID)));
        let mut body = BytesMut::new();
        header
            .encode(&mut body, R::header_version(version))
            .and_then(|()| request.encode(&mut body, version))
            .map_err(|e| self.codec(api, "encode the request", e.to_string()))?;
        let size = i32::try_from(body.len())
            .map_err(|_| self.codec(api, "encode the request", "too large".into()))?;
        let mut frame = BytesMut::with_capacity(body.len() + 4);
        frame.put_i32(size);
        frame.extend_from_slice(&body);
        let io = |addr: &str, source| WireError::Io {
            addr: addr.to_string(),
            source,
        };
        self.stream
            .write_all(&frame)
            .and_then(|()| self.stream.flush())
            .map_err(|e| io(&self.addr, e))?;
        let mut size = [0u8; 4];
        self.stream
            .read_exact(&mut size)
            .map_err(|e| io(&self.addr, e))?;
        let size = i32::from_be_bytes(size);
        if !(0..=MAX_RESPONSE).contains(&size) {
            return Err(self.codec(api, "read the response", format!("size {size}")));
        }
        let mut buf = vec![0u8; size as usize];
        self.stream
            .read_exact(&mut buf)
            .map_err(|e| io(&self.addr, e))?;
        let mut buf = Bytes::from(buf);
        let header = ResponseHeader::decode(&mut buf, R::Response::header_version(version))
            .map_err(|e| self.codec(api, "decode the response header", e.to_string()))?;
        if header.correlation_id != correlation {
            return Err(self.codec(
                api,
                "match the response",
                format!(
                    "correlation id {} for request {correlation}",
                    header.correlation_id
                ),
            ));
        }
        let response = R::Response::decode(&mut buf, version)
            .map_err(|e| self.codec(api, "decode the response", e.to_string()))?;
        if buf.has_remaining() {
            tracing::debug!(api = ?api, left = buf.remaining(), "response has unread bytes");
        }
        Ok(response)
    }

    fn codec(&self, api: ApiKey, what: &'static str, why: String) -> WireError {
        WireError::Codec {
            addr: self.addr.clone(),
            api,
            what,
            why,
        }
    }
}

/// Larger answers than this are refused as a framing error (a whole cluster's metadata is far
/// below it).
const MAX_RESPONSE: i32 = 256 * 1024 * 1024;

fn api_key(key: i16) -> ApiKey {
    // Every key used here comes from a generated `Request` impl, which has an `ApiKey`.
    ApiKey::try_from(key).unwrap_or(ApiKey::ApiVersions)
}

fn tls_connect(addr: &str, tls: &Tls, tcp: TcpStream) -> Result<SslStream<TcpStream>, WireError> {
    let fail = |why: String| WireError::Tls {
        addr: addr.to_string(),
        why,
    };
    let stack = |what: &str, e: openssl::error::ErrorStack| fail(format!("{what}: {e}"));
    let mut builder =
        SslConnector::builder(SslMethod::tls_client()).map_err(|e| stack("setup", e))?;
    if let Some(ca) = &tls.ca {
        builder
            .set_ca_file(ca)
            .map_err(|e| stack(&format!("ssl.ca.location {ca}"), e))?;
    }
    if let Some(certificate) = &tls.certificate {
        builder
            .set_certificate_chain_file(certificate)
            .map_err(|e| stack(&format!("ssl.certificate.location {certificate}"), e))?;
    }
    if let Some(key) = &tls.key {
        let what = format!("ssl.key.location {key}");
        let pem = std::fs::read(key).map_err(|e| fail(format!("{what}: {e}")))?;
        let pkey = match &tls.key_password {
            Some(password) => PKey::private_key_from_pem_passphrase(&pem, password.as_bytes()),
            None => PKey::private_key_from_pem(&pem),
        }
        .map_err(|e| stack(&what, e))?;
        builder
            .set_private_key(&pkey)
            .map_err(|e| stack(&what, e))?;
    }
    if !tls.verify_certificate {
        builder.set_verify(SslVerifyMode::NONE);
    }
    let connector = builder.build();
    let mut config = connector.configure().map_err(|e| stack("setup", e))?;
    config.set_verify_hostname(tls.verify_hostname && tls.verify_certificate);
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    config
        .connect(host, tcp)
        .map_err(|e| fail(format!("handshake: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn plaintext_is_the_default() {
        let s = Security::from_settings(&[]).unwrap();
        assert!(s.tls.is_none() && s.sasl.is_none());
    }

    #[test]
    fn ssl_settings_are_read_the_way_librdkafka_names_them() {
        let s = Security::from_settings(&settings(&[
            ("security.protocol", "SSL"),
            ("ssl.ca.location", "/ca.pem"),
            ("ssl.endpoint.identification.algorithm", "none"),
        ]))
        .unwrap();
        let tls = s.tls.unwrap();
        assert_eq!(tls.ca.as_deref(), Some("/ca.pem"));
        assert!(tls.verify_certificate && !tls.verify_hostname);
    }

    #[test]
    fn what_this_client_cannot_do_is_refused_by_name() {
        let refused = |pairs: &[(&str, &str)]| {
            Security::from_settings(&settings(pairs))
                .unwrap_err()
                .to_string()
        };
        assert!(refused(&[("ssl.keystore.location", "/k.p12")]).contains("ssl.keystore.location"));
        assert!(
            refused(&[
                ("security.protocol", "SASL_SSL"),
                ("sasl.mechanism", "OAUTHBEARER")
            ])
            .contains("OAUTHBEARER")
        );
        assert!(
            refused(&[
                ("security.protocol", "SASL_SSL"),
                ("sasl.mechanism", "SCRAM-SHA-512"),
                ("sasl.username", "u")
            ])
            .contains("sasl.password")
        );
        assert!(refused(&[("security.protocol", "tls")]).contains("security.protocol"));
        assert!(
            refused(&[
                ("security.protocol", "SASL_PLAINTEXT"),
                ("sasl.mechanism", "PLAIN")
            ])
            .contains("sasl.username")
        );
    }

    #[test]
    fn sasl_plain_takes_its_credentials() {
        let s = Security::from_settings(&settings(&[
            ("security.protocol", "sasl_plaintext"),
            ("sasl.mechanisms", "PLAIN"),
            ("sasl.username", "u"),
            ("sasl.password", "secret"),
        ]))
        .unwrap();
        let sasl = s.sasl.as_ref().unwrap();
        assert_eq!(sasl.mechanism, Mechanism::Plain);
        assert_eq!(
            (sasl.user.as_str(), sasl.password.as_str()),
            ("u", "secret")
        );
        assert!(!format!("{s:?}").contains("secret"));
    }

    #[test]
    fn sasl_scram_takes_its_hash_from_the_mechanism() {
        for (name, hash) in [
            ("SCRAM-SHA-256", Hash::Sha256),
            ("SCRAM-SHA-512", Hash::Sha512),
        ] {
            let s = Security::from_settings(&settings(&[
                ("security.protocol", "SASL_PLAINTEXT"),
                ("sasl.mechanism", name),
                ("sasl.username", "onceflow"),
                ("sasl.password", "onceflow-secret"),
            ]))
            .unwrap();
            let sasl = s.sasl.as_ref().unwrap();
            assert_eq!(sasl.mechanism, Mechanism::Scram(hash));
            assert_eq!(sasl.mechanism.name(), name);
            assert!(!format!("{s:?}").contains("onceflow-secret"));
        }
    }
}
