//! The client side of SASL SCRAM (RFC 5802) with SHA-256 and SHA-512 (RFC 7677), as Kafka
//! speaks it: client-first, server-first, client-final, server-final, each carried whole in
//! one SaslAuthenticate frame (the `wire` module does the carrying).
//!
//! Only the messages are made and checked here; the primitives are RustCrypto's (`hmac`,
//! `sha2`, `pbkdf2`). The channel binding is "n" (none), as Kafka's own clients and librdkafka
//! use it; the password goes into PBKDF2 as its UTF-8 bytes, as Kafka's broker derives its
//! stored credentials (no SASLprep normalization on either side).

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::{Digest, Sha256, Sha512};

/// Which hash a SCRAM exchange uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hash {
    Sha256,
    Sha512,
}

impl Hash {
    pub fn mechanism(self) -> &'static str {
        match self {
            Hash::Sha256 => "SCRAM-SHA-256",
            Hash::Sha512 => "SCRAM-SHA-512",
        }
    }

    fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        match self {
            Hash::Sha256 => hmac_of::<Hmac<Sha256>>(key, data),
            Hash::Sha512 => hmac_of::<Hmac<Sha512>>(key, data),
        }
    }

    fn digest(self, data: &[u8]) -> Vec<u8> {
        match self {
            Hash::Sha256 => Sha256::digest(data).to_vec(),
            Hash::Sha512 => Sha512::digest(data).to_vec(),
        }
    }

    fn salted_password(self, password: &str, salt: &[u8], iterations: u32) -> Vec<u8> {
        match self {
            Hash::Sha256 => {
                let mut out = [0u8; 32];
                pbkdf2::pbkdf2_hmac::<Sha256>(password.as_bytes(), salt, iterations, &mut out);
                out.to_vec()
            }
            Hash::Sha512 => {
                let mut out = [0u8; 64];
                pbkdf2::pbkdf2_hmac::<Sha512>(password.as_bytes(), salt, iterations, &mut out);
                out.to_vec()
            }
        }
    }
}

fn hmac_of<M: Mac + hmac::digest::KeyInit>(key: &[u8], data: &[u8]) -> Vec<u8> {
    // HMAC takes a key of any length: `new_from_slice` cannot fail for it.
    let mut mac = <M as hmac::digest::KeyInit>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC accepts keys of every length"));
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// Why an exchange failed on the client's side.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ScramError {
    #[error("the server's first message is malformed: {0}")]
    ServerFirst(String),
    #[error("the server's final message is malformed: {0}")]
    ServerFinal(String),
    #[error("the server refused the proof: {0}")]
    Refused(String),
    #[error("the server's signature is wrong: it does not know the password")]
    Signature,
}

/// At most this many PBKDF2 iterations are done for a server (Kafka refuses more than 16384
/// for its own credentials): a larger count is a server wasting the client's time.
const MAX_ITERATIONS: u32 = 1_000_000;

/// One SCRAM exchange, from the client's first message to the check of the server's last.
pub struct Scram {
    hash: Hash,
    password: String,
    nonce: String,
    client_first_bare: String,
    /// ServerSignature, once the client-final message has been made.
    server_signature: Option<Vec<u8>>,
}

impl Scram {
    /// An exchange with a fresh nonce: 24 bytes from the thread's CSPRNG (ChaCha, seeded and
    /// reseeded from the operating system), base64url-encoded.
    pub fn new(hash: Hash, user: &str, password: &str) -> Scram {
        let mut bytes = [0u8; 24];
        rand::rng().fill_bytes(&mut bytes);
        Scram::with_nonce(hash, user, password, &URL_SAFE_NO_PAD.encode(bytes))
    }

    fn with_nonce(hash: Hash, user: &str, password: &str, nonce: &str) -> Scram {
        Scram {
            hash,
            password: password.to_string(),
            nonce: nonce.to_string(),
            client_first_bare: format!("n={},r={nonce}", escape_username(user)),
            server_signature: None,
        }
    }

    /// The client-first message: no channel binding, no authorization identity.
    pub fn client_first(&self) -> String {
        format!("n,,{}", self.client_first_bare)
    }

    /// The client-final message that answers the server-first one.
    pub fn client_final(&mut self, server_first: &[u8]) -> Result<String, ScramError> {
        let bad = |why: &str| ScramError::ServerFirst(why.to_string());
        let server_first = std::str::from_utf8(server_first).map_err(|_| bad("it is not UTF-8"))?;
        let mut attributes = server_first.split(',');
        let nonce = attributes
            .next()
            .and_then(|a| a.strip_prefix("r="))
            .ok_or_else(|| bad("it does not begin with the nonce (r=)"))?;
        let salt = attributes
            .next()
            .and_then(|a| a.strip_prefix("s="))
            .ok_or_else(|| bad("no salt (s=) after the nonce"))?;
        let iterations = attributes
            .next()
            .and_then(|a| a.strip_prefix("i="))
            .ok_or_else(|| bad("no iteration count (i=) after the salt"))?;
        if !nonce.starts_with(&self.nonce) || nonce.len() == self.nonce.len() {
            return Err(bad("its nonce does not extend the client's"));
        }
        let salt = STANDARD
            .decode(salt)
            .map_err(|e| bad(&format!("the salt is not base64: {e}")))?;
        let iterations: u32 = iterations
            .parse()
            .ok()
            .filter(|i| (1..=MAX_ITERATIONS).contains(i))
            .ok_or_else(|| {
                bad(&format!(
                    "iteration count `{iterations}` is not within 1..={MAX_ITERATIONS}"
                ))
            })?;

        let hash = self.hash;
        let salted = hash.salted_password(&self.password, &salt, iterations);
        let client_key = hash.hmac(&salted, b"Client Key");
        let stored_key = hash.digest(&client_key);
        // "biws" is base64("n,,"), the GS2 header of the client-first message.
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{server_first},{without_proof}", self.client_first_bare);
        let client_signature = hash.hmac(&stored_key, auth_message.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&client_signature)
            .map(|(k, s)| k ^ s)
            .collect();
        let server_key = hash.hmac(&salted, b"Server Key");
        self.server_signature = Some(hash.hmac(&server_key, auth_message.as_bytes()));
        Ok(format!("{without_proof},p={}", STANDARD.encode(proof)))
    }

    /// Checks the server-final message: the server proves it knows the password too.
    pub fn verify_server_final(&self, server_final: &[u8]) -> Result<(), ScramError> {
        let bad = |why: &str| ScramError::ServerFinal(why.to_string());
        let server_final = std::str::from_utf8(server_final).map_err(|_| bad("it is not UTF-8"))?;
        let first = server_final.split(',').next().unwrap_or_default();
        if let Some(error) = first.strip_prefix("e=") {
            return Err(ScramError::Refused(error.to_string()));
        }
        let signature = first
            .strip_prefix("v=")
            .ok_or_else(|| bad("neither a verifier (v=) nor an error (e=)"))?;
        let signature = STANDARD
            .decode(signature)
            .map_err(|e| bad(&format!("the verifier is not base64: {e}")))?;
        let expected = self
            .server_signature
            .as_deref()
            .ok_or_else(|| bad("it came before the client's final message"))?;
        if constant_time_eq(expected, &signature) {
            Ok(())
        } else {
            Err(ScramError::Signature)
        }
    }
}

/// A username as a SCRAM `saslname`: ',' and '=' are written =2C and =3D.
fn escape_username(user: &str) -> String {
    user.replace('=', "=3D").replace(',', "=2C")
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677, section 3: user "user", password "pencil".
    #[test]
    fn rfc_7677_sha_256_exchange() {
        let mut scram = Scram::with_nonce(Hash::Sha256, "user", "pencil", "rOprNGfwEbeRWgbNEkqO");
        assert_eq!(scram.client_first(), "n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let server_first = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
                            s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        assert_eq!(
            scram.client_final(server_first.as_bytes()).unwrap(),
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
             p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        scram
            .verify_server_final(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
            .unwrap();
        // One character off, and the server is not believed.
        assert_eq!(
            scram.verify_server_final(b"v=7rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="),
            Err(ScramError::Signature)
        );
        assert_eq!(
            scram.verify_server_final(b"e=invalid-proof"),
            Err(ScramError::Refused("invalid-proof".into()))
        );
    }

    /// SCRAM-SHA-512 has no RFC vector: this one was computed with Python's hashlib and hmac
    /// (an implementation independent of RustCrypto's), following RFC 5802 step by step.
    #[test]
    fn sha_512_exchange_matches_an_independent_computation() {
        let mut scram = Scram::with_nonce(
            Hash::Sha512,
            "onceflow",
            "onceflow-secret",
            "fyko+d2lbbFgONRv9qkxdawL",
        );
        assert_eq!(
            scram.client_first(),
            "n,,n=onceflow,r=fyko+d2lbbFgONRv9qkxdawL"
        );
        let server_first = format!("r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s={SALT},i=4096");
        assert_eq!(
            scram.client_final(server_first.as_bytes()).unwrap(),
            format!("c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p={SHA512_PROOF}")
        );
        scram
            .verify_server_final(format!("v={SHA512_SERVER_SIGNATURE}").as_bytes())
            .unwrap();
    }

    const SALT: &str = "QSXCR+Q6sek8bf92";
    const SHA512_PROOF: &str =
        "k38znI+eezAOdkO2QjPZ5qEFLsfreKS0tCJWe81eDxlDoRUgZfW4u2kbmoKdq3QKtW277bQUO7CXUFrfJtIKRg==";
    const SHA512_SERVER_SIGNATURE: &str =
        "B4KUN9qwAA0Xw7cOlyXD+xsgTfZuBFkzko2AOvIbRRMAcM7lUUEancMLz6bp1JcannDhcZXsQZOCua5LUiX+SQ==";

    #[test]
    fn a_server_that_does_not_extend_the_nonce_is_refused() {
        let mut scram = Scram::with_nonce(Hash::Sha256, "user", "pencil", "abc");
        for server_first in ["r=abc,s=QSXC,i=4096", "r=xyzabc,s=QSXC,i=4096"] {
            assert!(matches!(
                scram.client_final(server_first.as_bytes()),
                Err(ScramError::ServerFirst(why)) if why.contains("nonce")
            ));
        }
        assert!(matches!(
            scram.client_final(b"r=abcd,s=QSXC,i=0"),
            Err(ScramError::ServerFirst(why)) if why.contains("iteration")
        ));
        assert!(matches!(
            scram.client_final(b"m=ext,r=abcd,s=QSXC,i=4096"),
            Err(ScramError::ServerFirst(_))
        ));
        // No verdict on a server-final message before the client's proof.
        assert!(
            Scram::with_nonce(Hash::Sha256, "u", "p", "n")
                .verify_server_final(b"v=AAAA")
                .is_err()
        );
    }

    #[test]
    fn usernames_escape_comma_and_equals() {
        let scram = Scram::with_nonce(Hash::Sha256, "a,b=c", "p", "n");
        assert_eq!(scram.client_first(), "n,,n=a=2Cb=3Dc,r=n");
    }

    #[test]
    fn fresh_nonces_differ_and_are_printable() {
        let a = Scram::new(Hash::Sha256, "u", "p");
        let b = Scram::new(Hash::Sha256, "u", "p");
        assert_ne!(a.nonce, b.nonce);
        assert_eq!(a.nonce.len(), 32);
        assert!(a.nonce.bytes().all(|c| c.is_ascii_graphic() && c != b','));
    }
}
