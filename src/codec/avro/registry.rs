//! The schema registry (Confluent's REST API: Confluent Schema Registry, Apicurio's
//! `/apis/ccompat/v7`, Redpanda, Karapace), spoken through schema_registry_converter's blocking
//! calls, and the cache in front of it.
//!
//! A writer schema is fetched once per id and kept for the life of the process (an id never
//! changes its schema); an id the registry answers 404 for is remembered as unknown for
//! [`UNKNOWN_FOR`], so that a run of poison records naming it does not call the registry for
//! each. Output schemas are registered (or looked up) once, when the job starts. Nothing else
//! calls the registry: decoding and encoding never do once the ids they meet are cached.
//!
//! Every call blocks (reqwest's blocking client); callers run on the job's own thread, never
//! on an async executor's worker.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use apache_avro::Schema;
use schema_registry_converter::blocking::schema_registry::{
    SrSettings, get_schema_by_id, is_compatible_schema, perform_sr_call, post_schema,
};
use schema_registry_converter::error::SRCError;
use schema_registry_converter::schema_registry_common::{
    RawError, SchemaType, SrCall, SuppliedSchema,
};

use super::schema::Compiled;
use crate::topology::SchemaRegistry;

/// How long an id the registry did not know is taken as unknown before it is asked again.
pub const UNKNOWN_FOR: Duration = Duration::from_secs(60);

/// A writer schema as fetched: parsed, compiled, and its text ([`schema_text`], to tell
/// whether it is the reader schema itself).
#[derive(Debug)]
pub struct Writer {
    pub schema: Schema,
    pub compiled: Compiled,
    pub canonical: String,
}

impl Writer {
    pub fn new(schema: Schema) -> Result<Writer, String> {
        let compiled = Compiled::new(&schema)?;
        let canonical = schema_text(&schema);
        Ok(Writer {
            schema,
            compiled,
            canonical,
        })
    }
}

/// Why a schema id could not be looked up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The registry answered that it does not know the id (or its schema is not valid
    /// Avro): the record's fault.
    Unknown(String),
    /// The registry could not be asked: down, timing out, refusing the credentials.
    Unavailable(String),
}

enum Entry {
    Known(Arc<Writer>),
    Unknown { since: Instant, message: String },
}

/// The registry client and its cache of schemas by id.
pub struct Registry {
    /// `None` offline (`onceflow test`, unit tests): only schemas added by hand are known.
    settings: Option<SrSettings>,
    url: String,
    by_id: RwLock<HashMap<u32, Entry>>,
    /// Ids given to schemas registered offline.
    next_local_id: std::sync::atomic::AtomicU32,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("url", &self.url).finish()
    }
}

impl Registry {
    /// A client of the registry `config` names. Makes no call.
    pub fn connect(config: &SchemaRegistry) -> Result<Registry, String> {
        let mut builder = SrSettings::new_builder(config.url.trim_end_matches('/').to_string());
        builder.set_timeout(Duration::from_millis(config.timeout_ms));
        if let Some(user) = &config.username {
            builder.set_basic_authorization(user, config.password.as_deref());
        }
        let settings = builder
            .build()
            .map_err(|e| format!("schema registry {}: {}", config.url, message(&e)))?;
        Ok(Registry {
            settings: Some(settings),
            url: config.url.clone(),
            by_id: RwLock::new(HashMap::new()),
            next_local_id: 1.into(),
        })
    }

    /// A registry without a server: schemas are added by hand ([`Registry::add`]) or
    /// registered with local ids.
    pub fn offline() -> Registry {
        Registry {
            settings: None,
            url: "(offline)".into(),
            by_id: RwLock::new(HashMap::new()),
            next_local_id: 1.into(),
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Makes `schema` known under `id` (offline use: `onceflow test`, tests).
    pub fn add(&self, id: u32, schema: Schema) -> Result<Arc<Writer>, String> {
        let writer = Arc::new(Writer::new(schema)?);
        write_lock(&self.by_id).insert(id, Entry::Known(Arc::clone(&writer)));
        Ok(writer)
    }

    /// The writer schema of `id`: from the cache, or fetched once and cached.
    pub fn writer(&self, id: u32) -> Result<Arc<Writer>, Lookup> {
        match read_lock(&self.by_id).get(&id) {
            Some(Entry::Known(w)) => return Ok(Arc::clone(w)),
            Some(Entry::Unknown { since, message }) if since.elapsed() < UNKNOWN_FOR => {
                return Err(Lookup::Unknown(message.clone()));
            }
            _ => {}
        }
        let Some(settings) = &self.settings else {
            return Err(Lookup::Unknown(format!("schema id {id} is not known")));
        };
        let fetched = get_schema_by_id(id, settings);
        let entry = match fetched {
            Ok(registered) => match Schema::parse_str(&registered.schema)
                .map_err(|e| e.to_string())
                .and_then(Writer::new)
            {
                Ok(w) => Entry::Known(Arc::new(w)),
                Err(e) => Entry::Unknown {
                    since: Instant::now(),
                    message: format!("schema id {id} is not a valid Avro schema: {e}"),
                },
            },
            Err(e) if not_found(&e) => Entry::Unknown {
                since: Instant::now(),
                message: format!("schema id {id} is unknown to the registry at {}", self.url),
            },
            Err(e) => {
                return Err(Lookup::Unavailable(format!(
                    "cannot fetch schema id {id} from the registry at {}: {}",
                    self.url,
                    message(&e)
                )));
            }
        };
        let result = match &entry {
            Entry::Known(w) => Ok(Arc::clone(w)),
            Entry::Unknown { message, .. } => Err(Lookup::Unknown(message.clone())),
        };
        write_lock(&self.by_id).insert(id, entry);
        result
    }

    /// The id of `schema` under `subject`: registered when `auto_register` (the registry
    /// refuses a schema incompatible with the subject's versions), looked up otherwise.
    pub fn register(
        &self,
        subject: &str,
        schema: &Schema,
        auto_register: bool,
    ) -> Result<u32, String> {
        let text = schema_text(schema);
        let Some(settings) = &self.settings else {
            let id = self
                .next_local_id
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.add(id, schema.clone())?;
            return Ok(id);
        };
        let id = if auto_register {
            self.post(settings, subject, &text)?
        } else {
            self.lookup(subject, schema)??
        };
        self.add(id, schema.clone())?;
        Ok(id)
    }

    /// Registers `text` under `subject` (the registry returns the existing id of a schema it
    /// has already).
    fn post(&self, settings: &SrSettings, subject: &str, text: &str) -> Result<u32, String> {
        post_schema(
            settings,
            subject.to_string(),
            SuppliedSchema::new(None, SchemaType::Avro, text.to_string()),
        )
        .map(|r| r.id)
        .map_err(|e| {
            format!(
                "the registry at {} refused the schema of subject `{subject}`: {}",
                self.url,
                message(&e)
            )
        })
    }

    /// The id of `schema` among the versions of `subject`: `Ok(Err(problem))` when the
    /// subject does not have it, `Err` when the registry cannot be asked.
    pub fn lookup(&self, subject: &str, schema: &Schema) -> Result<Result<u32, String>, String> {
        let Some(settings) = &self.settings else {
            return Ok(Err("offline".into()));
        };
        let text = schema_text(schema);
        let body = serde_json::json!({ "schema": text, "schemaType": "AVRO" }).to_string();
        match perform_sr_call(settings, SrCall::PostForVersion(subject, &body)) {
            Ok(found) => Ok(found
                .id
                .ok_or_else(|| format!("the registry gave no id for subject `{subject}`"))),
            Err(e) if not_found(&e) => Ok(Err(format!(
                "subject `{subject}` of the registry at {} has no version with the output's \
                 schema (auto_register is false): {}",
                self.url,
                message(&e)
            ))),
            Err(e) => Err(format!(
                "the registry at {} cannot look up subject `{subject}`: {}",
                self.url,
                message(&e)
            )),
        }
    }

    /// Whether `schema` may be registered under `subject` (a subject without versions takes
    /// any schema).
    pub fn is_compatible(&self, subject: &str, schema: &Schema) -> Result<bool, String> {
        let Some(settings) = &self.settings else {
            return Ok(true);
        };
        match is_compatible_schema(
            settings,
            subject.to_string(),
            SuppliedSchema::new(None, SchemaType::Avro, schema_text(schema)),
        ) {
            Ok(ok) => Ok(ok),
            Err(e) if not_found(&e) => Ok(true),
            Err(e) => Err(format!(
                "the registry at {} cannot check subject `{subject}`: {}",
                self.url,
                message(&e)
            )),
        }
    }

    /// Whether the registry answers (its subject list).
    pub fn ping(&self) -> Result<(), String> {
        let Some(settings) = &self.settings else {
            return Ok(());
        };
        schema_registry_converter::blocking::schema_registry::get_all_subjects(settings)
            .map(|_| ())
            .map_err(|e| {
                format!(
                    "the registry at {} does not answer: {}",
                    self.url,
                    message(&e)
                )
            })
    }
}

/// The schema as JSON text, logical types, defaults and aliases included (Avro's Parsing
/// Canonical Form leaves them out: registered so, a schema would lose them). Also what tells
/// a writer schema from a reader schema.
pub fn schema_text(schema: &Schema) -> String {
    serde_json::to_string(schema).unwrap_or_else(|_| schema.canonical_form())
}

/// Whether the registry answered 404 (Confluent's error codes 404xx: subject, version or
/// schema not found).
fn not_found(e: &SRCError) -> bool {
    let code = std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<RawError>())
        .map(|r| r.error_code);
    match code {
        Some(c) => c == 404 || (40400..40500).contains(&c),
        None => e.cause.as_deref().is_some_and(|c| c.contains("status 404")),
    }
}

/// The registry's own words (its error message and code), not the converter's wrapping.
fn message(e: &SRCError) -> String {
    let raw = std::error::Error::source(e).and_then(|s| s.downcast_ref::<RawError>());
    match (raw, &e.cause) {
        (Some(r), _) => format!("{} ({}: error code {})", r.message, e.error, r.error_code),
        (None, Some(cause)) => format!("{}: {cause}", e.error),
        (None, None) => e.error.clone(),
    }
}

fn read_lock<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    // A poisoned cache still holds valid entries: each is inserted whole.
    l.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write_lock<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    //! The registry client against a focused HTTP double: what each answer of a registry
    //! becomes (the real one, Apicurio, is in tests/avro.rs; it cannot be made to answer 500
    //! or to refuse credentials on demand).
    use super::*;
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::IntoResponse;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const SCHEMA: &str = r#"{"type":"record","name":"R","fields":[{"name":"id","type":"long"}]}"#;

    /// A registry that needs basic auth `u:p` ("dTpw"), knows schema id 1, answers 404 (with
    /// Confluent's error code) for id 2 and 500 for id 3; counts the calls.
    fn double() -> (String, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&calls);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                tx.send(listener.local_addr().unwrap()).unwrap();
                let app = axum::Router::new().route(
                    "/schemas/ids/{id}",
                    axum::routing::get(
                        move |axum::extract::Path(id): axum::extract::Path<u32>,
                              headers: HeaderMap| {
                            let counted = Arc::clone(&counted);
                            async move {
                                counted.fetch_add(1, Ordering::SeqCst);
                                let auth =
                                    headers.get("authorization").and_then(|v| v.to_str().ok());
                                if auth != Some("Basic dTpw") {
                                    return (
                                        StatusCode::UNAUTHORIZED,
                                        r#"{"error_code":401,"message":"Unauthorized"}"#,
                                    )
                                        .into_response();
                                }
                                match id {
                                    1 => (
                                        StatusCode::OK,
                                        serde_json::json!({"schema": SCHEMA}).to_string(),
                                    )
                                        .into_response(),
                                    2 => (
                                        StatusCode::NOT_FOUND,
                                        r#"{"error_code":40403,"message":"Schema not found"}"#,
                                    )
                                        .into_response(),
                                    _ => (
                                        StatusCode::INTERNAL_SERVER_ERROR,
                                        r#"{"error_code":50001,"message":"boom"}"#,
                                    )
                                        .into_response(),
                                }
                            }
                        },
                    ),
                );
                axum::serve(listener, app).await.unwrap();
            });
        });
        (format!("http://{}", rx.recv().unwrap()), calls)
    }

    fn client(url: &str, password: &str) -> Registry {
        Registry::connect(&SchemaRegistry {
            url: url.to_string(),
            username: Some("u".into()),
            password: Some(password.into()),
            timeout_ms: 2_000,
        })
        .unwrap()
    }

    #[test]
    fn each_answer_of_the_registry_is_a_schema_the_records_fault_or_a_transient_failure() {
        let (url, calls) = double();
        let r = client(&url, "p");
        // Fetched once, then from the cache.
        assert!(r.writer(1).is_ok());
        assert!(r.writer(1).is_ok());
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // 404: the record's fault, remembered.
        let unknown = r.writer(2).unwrap_err();
        assert!(
            matches!(&unknown, Lookup::Unknown(m) if m.contains("schema id 2 is unknown")),
            "{unknown:?}"
        );
        assert!(matches!(r.writer(2), Err(Lookup::Unknown(_))));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        // 500: transient, asked again next time.
        assert!(matches!(r.writer(3), Err(Lookup::Unavailable(m)) if m.contains("boom")));
        assert!(matches!(r.writer(3), Err(Lookup::Unavailable(_))));
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        // Refused credentials: transient (the record is good), with the registry's words.
        let refused = client(&url, "wrong").writer(1).unwrap_err();
        assert!(
            matches!(&refused, Lookup::Unavailable(m) if m.contains("Unauthorized")),
            "{refused:?}"
        );
        // Nobody listening: transient.
        let gone = client("http://127.0.0.1:1", "p").writer(1).unwrap_err();
        assert!(matches!(gone, Lookup::Unavailable(_)), "{gone:?}");
    }
}
