//! TLS for connections to PostgreSQL, as libpq's `sslmode` and `sslrootcert` say.
//!
//! tokio-postgres knows `sslmode=disable|prefer|require` only, and leaves certificates to the
//! TLS connector. The connection string is read here first: `verify-ca` and `verify-full` are
//! taken out (tokio-postgres is told `require`), so is `sslrootcert`, and the OpenSSL connector
//! is built to match libpq:
//!
//! | `sslmode` | encrypted | server verified |
//! |---|---|---|
//! | `disable` | never | no |
//! | `prefer` (default) | when the server offers TLS | no |
//! | `require` | always | no (as `verify-ca` when `sslrootcert` is given, like libpq) |
//! | `verify-ca` | always | its certificate chains to `sslrootcert` (default: the system's roots) |
//! | `verify-full` | always | as `verify-ca`, and the certificate names the host connected to |

use openssl::ssl::{SslConnector, SslMethod, SslVerifyMode};
use postgres_openssl::MakeTlsConnector;

/// How a connection is secured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// The TLS part of a connection string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tls {
    pub mode: SslMode,
    /// PEM file of the certificate authorities to trust, instead of the system's.
    pub root_cert: Option<String>,
}

impl Tls {
    /// Splits a connection string (URL or `key=value` form) into what tokio-postgres takes and
    /// the TLS settings.
    pub fn split(conn: &str) -> Result<(String, Tls), String> {
        let mut tls = Tls {
            mode: SslMode::Prefer,
            root_cert: None,
        };
        let mut take = |key: &str, value: &str| -> Result<Option<String>, String> {
            match key {
                "sslmode" => {
                    let (mode, passed) = match value {
                        "disable" => (SslMode::Disable, "disable"),
                        "prefer" => (SslMode::Prefer, "prefer"),
                        "require" => (SslMode::Require, "require"),
                        "verify-ca" => (SslMode::VerifyCa, "require"),
                        "verify-full" => (SslMode::VerifyFull, "require"),
                        other => {
                            return Err(format!(
                                "sslmode `{other}` is not one of disable, prefer, require, verify-ca, verify-full"
                            ));
                        }
                    };
                    tls.mode = mode;
                    Ok(Some(format!("sslmode={passed}")))
                }
                "sslrootcert" => {
                    tls.root_cert = Some(value.to_string());
                    Ok(None)
                }
                _ => Ok(Some(format!("{key}={value}"))),
            }
        };
        let is_url = conn.starts_with("postgres://") || conn.starts_with("postgresql://");
        let rest = if is_url {
            // The query begins at the first `?` after the user information (a password may
            // hold a `?` of its own).
            let after_user = conn.rfind('@').map_or(0, |at| at + 1);
            match conn[after_user..].find('?').map(|q| after_user + q) {
                None => conn.to_string(),
                Some(q) => {
                    let (base, query) = (&conn[..q], &conn[q + 1..]);
                    let mut kept = Vec::new();
                    for pair in query.split('&').filter(|p| !p.is_empty()) {
                        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                        if let Some(p) = take(key, &percent_decode(value))? {
                            // Kept pairs go back as they came.
                            kept.push(if key == "sslmode" {
                                p
                            } else {
                                pair.to_string()
                            });
                        }
                    }
                    if kept.is_empty() {
                        base.to_string()
                    } else {
                        format!("{base}?{}", kept.join("&"))
                    }
                }
            }
        } else {
            // key=value form: only the spans of sslmode and sslrootcert are replaced, the rest
            // (quoted values, spacing) stays as it is.
            let mut out = conn.to_string();
            for (key, value, span) in conninfo_pairs(conn)?.into_iter().rev() {
                if key == "sslmode" || key == "sslrootcert" {
                    let replacement = take(&key, &value)?.unwrap_or_default();
                    let mut end = span.end;
                    if replacement.is_empty() {
                        // A pair taken out takes its following spaces along.
                        end += out[end..].len() - out[end..].trim_start().len();
                    }
                    out.replace_range(span.start..end, &replacement);
                }
            }
            out
        };
        if tls.mode == SslMode::Require && tls.root_cert.is_some() {
            tls.mode = SslMode::VerifyCa;
        }
        Ok((rest, tls))
    }

    /// The OpenSSL connector for these settings (not used with `disable`).
    pub fn connector(&self) -> Result<MakeTlsConnector, String> {
        let fail = |what: &str, e: openssl::error::ErrorStack| format!("TLS setup: {what}: {e}");
        let mut builder =
            SslConnector::builder(SslMethod::tls_client()).map_err(|e| fail("OpenSSL", e))?;
        let verify = matches!(self.mode, SslMode::VerifyCa | SslMode::VerifyFull);
        if verify {
            if let Some(path) = &self.root_cert {
                builder
                    .set_ca_file(path)
                    .map_err(|e| fail(&format!("cannot read sslrootcert `{path}`"), e))?;
            }
            builder.set_verify(SslVerifyMode::PEER);
        } else {
            builder.set_verify(SslVerifyMode::NONE);
        }
        let mut connector = MakeTlsConnector::new(builder.build());
        let check_host = self.mode == SslMode::VerifyFull;
        connector.set_callback(move |config, _host| {
            config.set_verify_hostname(check_host);
            Ok(())
        });
        Ok(connector)
    }
}

/// The `key = value` pairs of a libpq connection string, each with the bytes it spans. Values
/// may be single-quoted; a backslash escapes the next character.
fn conninfo_pairs(s: &str) -> Result<Vec<(String, String, std::ops::Range<usize>)>, String> {
    let chars: Vec<(usize, char)> = s.char_indices().collect();
    let at = |i: usize| chars.get(i).map(|&(_, c)| c);
    let offset = |i: usize| chars.get(i).map_or(s.len(), |&(o, _)| o);
    let skip_spaces = |mut i: usize| {
        while at(i).is_some_and(char::is_whitespace) {
            i += 1;
        }
        i
    };
    let mut pairs = Vec::new();
    let mut i = skip_spaces(0);
    while i < chars.len() {
        let start = i;
        while at(i).is_some_and(|c| c != '=' && !c.is_whitespace()) {
            i += 1;
        }
        let key: String = chars[start..i].iter().map(|&(_, c)| c).collect();
        i = skip_spaces(i);
        if at(i) != Some('=') {
            // Not the text itself: it may be part of a password.
            return Err(format!(
                "not a list of key=value pairs (at byte {})",
                offset(start)
            ));
        }
        i = skip_spaces(i + 1);
        let mut value = String::new();
        if at(i) == Some('\'') {
            i += 1;
            loop {
                match at(i) {
                    None => {
                        return Err(format!(
                            "a quoted value has no closing quote (from byte {})",
                            offset(start)
                        ));
                    }
                    Some('\'') => break,
                    Some('\\') => {
                        value.extend(at(i + 1));
                        i += 2;
                        continue;
                    }
                    Some(c) => value.push(c),
                }
                i += 1;
            }
            i += 1;
        } else {
            while let Some(c) = at(i).filter(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(at(i + 1));
                    i += 2;
                } else {
                    value.push(c);
                    i += 1;
                }
            }
        }
        pairs.push((key, value, offset(start)..offset(i)));
        i = skip_spaces(i);
    }
    Ok(pairs)
}

/// Decodes `%XX` escapes of a URL query value (a path in `sslrootcert` may hold some).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(s: &str) -> (String, Tls) {
        Tls::split(s).unwrap()
    }

    #[test]
    fn libpq_modes_map_to_what_tokio_postgres_takes() {
        use SslMode::*;
        // (connection string, what tokio-postgres gets, mode, root certificate)
        let cases: &[(&str, &str, SslMode, Option<&str>)] = &[
            (
                "postgres://u:p@db:5432/app",
                "postgres://u:p@db:5432/app",
                Prefer,
                None,
            ),
            (
                "postgres://u:p@db/app?application_name=x&sslmode=verify-full&sslrootcert=/etc/ca%20dir/ca.pem",
                "postgres://u:p@db/app?application_name=x&sslmode=require",
                VerifyFull,
                Some("/etc/ca dir/ca.pem"),
            ),
            // require with a root certificate verifies it, as libpq does
            (
                "postgresql://db/app?sslmode=require&sslrootcert=ca.pem",
                "postgresql://db/app?sslmode=require",
                VerifyCa,
                Some("ca.pem"),
            ),
            (
                "postgres://db/app?sslmode=disable",
                "postgres://db/app?sslmode=disable",
                Disable,
                None,
            ),
            // a `?` in the password is not the query
            (
                "postgres://u:p?ss@db/app?sslmode=verify-ca&sslrootcert=ca.pem",
                "postgres://u:p?ss@db/app?sslmode=require",
                VerifyCa,
                Some("ca.pem"),
            ),
            (
                "host=db user=u sslmode=verify-ca sslrootcert=/ca.pem dbname=app",
                "host=db user=u sslmode=require dbname=app",
                VerifyCa,
                Some("/ca.pem"),
            ),
            // nothing to rewrite: the string goes as it came
            (
                "host=db password='two  spaces' sslmode=require",
                "host=db password='two  spaces' sslmode=require",
                Require,
                None,
            ),
            // spaces around `=`, quoted values with spaces and escapes
            (
                r"host=db password='a  b\'c' sslmode = verify-full sslrootcert='/a b/ca.pem' dbname=app",
                r"host=db password='a  b\'c' sslmode=require dbname=app",
                VerifyFull,
                Some("/a b/ca.pem"),
            ),
        ];
        for &(conn, passed, mode, root) in cases {
            let (url, tls) = split(conn);
            assert_eq!(
                (url.as_str(), tls.mode, tls.root_cert.as_deref()),
                (passed, mode, root),
                "{conn}"
            );
        }

        let err = Tls::split("host=db password=secret words").unwrap_err();
        assert!(!err.contains("words"), "{err}");
        let err = Tls::split("host=db password='secret").unwrap_err();
        assert!(!err.contains("secret"), "{err}");

        let err = Tls::split("postgres://db/app?sslmode=allow").unwrap_err();
        assert!(err.contains("sslmode `allow`"), "{err}");
    }

    #[test]
    fn a_missing_root_cert_file_is_named() {
        let tls = Tls {
            mode: SslMode::VerifyFull,
            root_cert: Some("/nonexistent/ca.pem".into()),
        };
        let err = tls.connector().err().expect("an error");
        assert!(err.contains("/nonexistent/ca.pem"), "{err}");
    }
}
