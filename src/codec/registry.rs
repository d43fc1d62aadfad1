//! The schema registry (Confluent's REST API: Confluent Schema Registry, Apicurio's
//! `/apis/ccompat/v7`, Redpanda, Karapace), spoken through schema_registry_converter's blocking
//! calls, and the cache in front of it. Every codec of the Confluent wire format (Avro,
//! Protobuf, JSON Schema) asks it for the schema an id names and registers its outputs' schemas
//! here; each compiles the schema text its own way.
//!
//! A schema is fetched once per id, with the schemas it references (Protobuf imports, JSON
//! Schema `$ref`s), and kept for the life of the process (an id never changes its schema); an
//! id the registry answers 404 for is remembered as unknown for [`UNKNOWN_FOR`], so that a run
//! of poison records naming it does not call the registry for each. Output schemas are
//! registered (or looked up) once, when the job starts. Nothing else calls the registry:
//! decoding and encoding never do once the ids they meet are cached.
//!
//! Every call blocks (reqwest's blocking client); callers run on the job's own thread, never
//! on an async executor's worker.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

use apache_avro::Schema;
use schema_registry_converter::blocking::schema_registry::{
    SrSettings, get_referenced_schema, get_schema_by_id, is_compatible_schema, perform_sr_call,
    post_schema,
};
use schema_registry_converter::error::SRCError;
use schema_registry_converter::schema_registry_common::{
    RawError, RegisteredReference, RegisteredSchema, SchemaType, SrCall, SuppliedReference,
    SuppliedSchema,
};

use crate::topology::SchemaRegistry;

/// How long an id the registry did not know is taken as unknown before it is asked again.
pub const UNKNOWN_FOR: Duration = Duration::from_secs(60);

/// At most this many schemas referenced, directly or not, by one schema.
const MAX_REFERENCES: usize = 256;

/// The magic byte of the Confluent wire format.
pub const MAGIC: u8 = 0;
/// Magic byte and schema id.
pub const HEADER_LEN: usize = 5;

/// The schema id of a value in the Confluent wire format, and the bytes after it.
pub fn split_header(bytes: &[u8]) -> Result<(u32, &[u8]), String> {
    if bytes.len() < HEADER_LEN {
        return Err(format!(
            "the value is {} byte(s) long, shorter than the 5-byte header of the Confluent wire \
             format (magic byte 0, schema id)",
            bytes.len()
        ));
    }
    if bytes[0] != MAGIC {
        return Err(format!(
            "the value starts with byte {:#04x}, not the magic byte 0 of the Confluent wire format",
            bytes[0]
        ));
    }
    let id = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
    Ok((id, &bytes[HEADER_LEN..]))
}

/// Magic byte and schema id, then `body`.
pub fn frame(id: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.push(MAGIC);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// The format of a registered schema (the registry's `schemaType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Avro,
    Protobuf,
    JsonSchema,
}

impl Format {
    /// The registry's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Format::Avro => "AVRO",
            Format::Protobuf => "PROTOBUF",
            Format::JsonSchema => "JSON",
        }
    }

    fn schema_type(self) -> SchemaType {
        match self {
            Format::Avro => SchemaType::Avro,
            Format::Protobuf => SchemaType::Protobuf,
            Format::JsonSchema => SchemaType::Json,
        }
    }

    fn of(t: &SchemaType) -> Option<Format> {
        match t {
            SchemaType::Avro => Some(Format::Avro),
            SchemaType::Protobuf => Some(Format::Protobuf),
            SchemaType::Json => Some(Format::JsonSchema),
            _ => None,
        }
    }
}

/// A schema as registered: its format, its text, and the schemas it references, by the name
/// it uses for each (an import path, a `$ref`), the references' own references included.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    pub format: Format,
    pub text: String,
    pub references: Vec<Reference>,
}

/// A schema another one references.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// The name the referencing schema uses (`import "common/money.proto"`, a `$ref` URL).
    pub name: String,
    /// The subject it is registered under.
    pub subject: String,
    pub text: String,
}

impl Registered {
    pub fn new(format: Format, text: impl Into<String>) -> Registered {
        Registered {
            format,
            text: text.into(),
            references: Vec::new(),
        }
    }
}

/// Why a schema id could not be looked up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The registry answered that it does not know the id (or the schema is not of the
    /// format the codec reads): the record's fault.
    Unknown(String),
    /// The registry could not be asked: down, timing out, refusing the credentials.
    Unavailable(String),
}

enum Entry {
    Known(Arc<Registered>),
    Unknown { since: Instant, message: String },
}

/// The registry client and its cache of schemas by id.
pub struct Registry {
    inner: Arc<Inner>,
}

/// What the registry client and its background fetches share.
struct Inner {
    /// `None` offline (`onceflow test`, unit tests): only schemas added by hand are known.
    settings: Option<SrSettings>,
    url: String,
    by_id: RwLock<HashMap<u32, Entry>>,
    /// The ids being fetched in the background, and where each fetch leaves its answer.
    fetching: Mutex<HashMap<u32, Arc<Fetch>>>,
    /// Ids given to schemas registered offline.
    next_local_id: std::sync::atomic::AtomicU32,
}

/// A fetch in the background: its answer once it has one.
#[derive(Default)]
struct Fetch {
    answer: Mutex<Option<Result<Arc<Registered>, Lookup>>>,
    done: Condvar,
}

/// How long a record's look-up waits for the fetch it starts: a registry answers in
/// milliseconds; one that does not within this holds the record's partition (it is tried
/// again once the fetch is done), not the job.
pub const FETCH_WAIT: Duration = Duration::from_millis(250);

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("url", &self.inner.url)
            .finish()
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
        Ok(Registry::with(Some(settings), config.url.clone()))
    }

    /// A registry without a server: schemas are added by hand ([`Registry::add`]) or
    /// registered with local ids.
    pub fn offline() -> Registry {
        Registry::with(None, "(offline)".into())
    }

    fn with(settings: Option<SrSettings>, url: String) -> Registry {
        Registry {
            inner: Arc::new(Inner {
                settings,
                url,
                by_id: RwLock::new(HashMap::new()),
                fetching: Mutex::new(HashMap::new()),
                next_local_id: 1.into(),
            }),
        }
    }

    pub fn url(&self) -> &str {
        &self.inner.url
    }

    /// Makes the Avro `schema` known under `id` (offline use: `onceflow test`, tests).
    pub fn add(&self, id: u32, schema: Schema) -> Result<(), String> {
        self.add_registered(id, Registered::new(Format::Avro, schema_text(&schema)));
        Ok(())
    }

    /// Makes `schema` known under `id` (offline use).
    pub fn add_registered(&self, id: u32, schema: Registered) {
        write_lock(&self.inner.by_id).insert(id, Entry::Known(Arc::new(schema)));
    }

    /// The schema of `id`, which must be in `format`: from the cache, or fetched once (with
    /// its references) and cached.
    pub fn schema(&self, id: u32, format: Format) -> Result<Arc<Registered>, Lookup> {
        let schema = self.registered(id)?;
        if schema.format != format {
            return Err(Lookup::Unknown(format!(
                "schema id {id} is a {} schema, not {}",
                schema.format.name(),
                format.name()
            )));
        }
        Ok(schema)
    }

    /// The schema of `id`, in whatever format: from the cache, or fetched once (with its
    /// references) and cached. The fetch runs in the background: the first look-up of an id
    /// waits for it up to [`FETCH_WAIT`]; one that finds it still running does not wait. Both
    /// are then `Unavailable`, and the answer is in the cache for the next look-up.
    pub fn registered(&self, id: u32) -> Result<Arc<Registered>, Lookup> {
        match read_lock(&self.inner.by_id).get(&id) {
            Some(Entry::Known(s)) => return Ok(Arc::clone(s)),
            Some(Entry::Unknown { since, message }) if since.elapsed() < UNKNOWN_FOR => {
                return Err(Lookup::Unknown(message.clone()));
            }
            _ => {}
        }
        if self.inner.settings.is_none() {
            return Err(Lookup::Unknown(format!("schema id {id} is not known")));
        }
        let (fetch, started) = {
            let mut fetching = lock(&self.inner.fetching);
            match fetching.get(&id) {
                Some(f) => (Arc::clone(f), false),
                None => {
                    let f = Arc::new(Fetch::default());
                    fetching.insert(id, Arc::clone(&f));
                    (f, true)
                }
            }
        };
        if started {
            let (inner, answer) = (Arc::clone(&self.inner), Arc::clone(&fetch));
            std::thread::spawn(move || {
                let result = inner.fetch(id);
                *lock(&answer.answer) = Some(result);
                lock(&inner.fetching).remove(&id);
                answer.done.notify_all();
            });
        }
        let wait = if started { FETCH_WAIT } else { Duration::ZERO };
        let answer = lock(&fetch.answer);
        let (answer, _) = fetch
            .done
            .wait_timeout_while(answer, wait, |a| a.is_none())
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        answer.clone().unwrap_or_else(|| {
            Err(Lookup::Unavailable(format!(
                "schema id {id}: the registry at {} has not answered yet (asked in the \
                 background; the record is tried again once it has)",
                self.inner.url
            )))
        })
    }
}

impl Inner {
    /// Fetches schema `id` and what it references, and caches the answer (a transient
    /// failure is not cached: the next look-up asks again).
    fn fetch(&self, id: u32) -> Result<Arc<Registered>, Lookup> {
        let Some(settings) = &self.settings else {
            return Err(Lookup::Unknown(format!("schema id {id} is not known")));
        };
        let unavailable = |what: String, e: &SRCError| {
            Lookup::Unavailable(format!(
                "cannot fetch {what} from the registry at {}: {}",
                self.url,
                message(e)
            ))
        };
        let entry = match get_schema_by_id(id, settings) {
            Ok(registered) => match Format::of(&registered.schema_type) {
                Some(format) => Entry::Known(Arc::new(Registered {
                    format,
                    references: self.references(settings, &registered, &unavailable)?,
                    text: registered.schema,
                })),
                None => Entry::Unknown {
                    since: Instant::now(),
                    message: format!(
                        "schema id {id} is of type {:?}, which no codec reads",
                        registered.schema_type
                    ),
                },
            },
            Err(e) if not_found(&e) => Entry::Unknown {
                since: Instant::now(),
                message: format!("schema id {id} is unknown to the registry at {}", self.url),
            },
            Err(e) => return Err(unavailable(format!("schema id {id}"), &e)),
        };
        let result = match &entry {
            Entry::Known(s) => Ok(Arc::clone(s)),
            Entry::Unknown { message, .. } => Err(Lookup::Unknown(message.clone())),
        };
        write_lock(&self.by_id).insert(id, entry);
        result
    }

    /// The schemas `root` references, directly or through others, each once.
    fn references(
        &self,
        settings: &SrSettings,
        root: &RegisteredSchema,
        unavailable: &dyn Fn(String, &SRCError) -> Lookup,
    ) -> Result<Vec<Reference>, Lookup> {
        let mut found: Vec<Reference> = Vec::new();
        let mut pending: Vec<RegisteredReference> = root.references.clone();
        while let Some(r) = pending.pop() {
            if found.iter().any(|f| f.name == r.name) {
                continue;
            }
            if found.len() >= MAX_REFERENCES {
                return Err(Lookup::Unknown(format!(
                    "schema id {} references more than {MAX_REFERENCES} schemas",
                    root.id
                )));
            }
            let what = format!(
                "reference `{}` (subject `{}` version {})",
                r.name, r.subject, r.version
            );
            let schema = match get_referenced_schema(settings, &r) {
                Ok(s) => s,
                Err(e) if not_found(&e) => {
                    return Err(Lookup::Unknown(format!(
                        "schema id {}: the registry at {} has no {what}",
                        root.id, self.url
                    )));
                }
                Err(e) => return Err(unavailable(what, &e)),
            };
            pending.extend(schema.references.iter().cloned());
            found.push(Reference {
                name: r.name,
                subject: r.subject,
                text: schema.schema,
            });
        }
        Ok(found)
    }
}

impl Registry {
    /// The id of the Avro `schema` under `subject`: registered when `auto_register` (the
    /// registry refuses a schema incompatible with the subject's versions), looked up
    /// otherwise.
    pub fn register(
        &self,
        subject: &str,
        schema: &Schema,
        auto_register: bool,
    ) -> Result<u32, String> {
        self.register_schema(
            subject,
            &Registered::new(Format::Avro, schema_text(schema)),
            auto_register,
        )
    }

    /// The id of `schema` under `subject`: registered when `auto_register`, looked up
    /// otherwise. Offline, a local id.
    pub fn register_schema(
        &self,
        subject: &str,
        schema: &Registered,
        auto_register: bool,
    ) -> Result<u32, String> {
        let Some(settings) = &self.inner.settings else {
            let id = self
                .inner
                .next_local_id
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.add_registered(id, schema.clone());
            return Ok(id);
        };
        let id = if auto_register {
            self.post(settings, subject, schema)?
        } else {
            self.lookup_schema(subject, schema)??
        };
        self.add_registered(id, schema.clone());
        Ok(id)
    }

    /// Registers `schema` under `subject` (the registry returns the existing id of a schema
    /// it has already).
    fn post(
        &self,
        settings: &SrSettings,
        subject: &str,
        schema: &Registered,
    ) -> Result<u32, String> {
        post_schema(settings, subject.to_string(), supplied(schema))
            .map(|r| r.id)
            .map_err(|e| {
                format!(
                    "the registry at {} refused the schema of subject `{subject}`: {}",
                    self.inner.url,
                    message(&e)
                )
            })
    }

    /// The id of the Avro `schema` among the versions of `subject`.
    pub fn lookup(&self, subject: &str, schema: &Schema) -> Result<Result<u32, String>, String> {
        self.lookup_schema(subject, &Registered::new(Format::Avro, schema_text(schema)))
    }

    /// The id of `schema` among the versions of `subject`: `Ok(Err(problem))` when the
    /// subject does not have it, `Err` when the registry cannot be asked.
    pub fn lookup_schema(
        &self,
        subject: &str,
        schema: &Registered,
    ) -> Result<Result<u32, String>, String> {
        let Some(settings) = &self.inner.settings else {
            return Ok(Err("offline".into()));
        };
        let body = serde_json::json!({
            "schema": schema.text,
            "schemaType": schema.format.name(),
            "references": references_json(schema),
        })
        .to_string();
        match perform_sr_call(settings, SrCall::PostForVersion(subject, &body)) {
            Ok(found) => Ok(found
                .id
                .ok_or_else(|| format!("the registry gave no id for subject `{subject}`"))),
            Err(e) if not_found(&e) => Ok(Err(format!(
                "subject `{subject}` of the registry at {} has no version with the output's \
                 schema (auto_register is false): {}",
                self.inner.url,
                message(&e)
            ))),
            Err(e) => Err(format!(
                "the registry at {} cannot look up subject `{subject}`: {}",
                self.inner.url,
                message(&e)
            )),
        }
    }

    /// Whether the Avro `schema` may be registered under `subject`.
    pub fn is_compatible(&self, subject: &str, schema: &Schema) -> Result<bool, String> {
        self.is_compatible_schema(subject, &Registered::new(Format::Avro, schema_text(schema)))
    }

    /// Whether `schema` may be registered under `subject` (a subject without versions takes
    /// any schema).
    pub fn is_compatible_schema(&self, subject: &str, schema: &Registered) -> Result<bool, String> {
        let Some(settings) = &self.inner.settings else {
            return Ok(true);
        };
        match is_compatible_schema(settings, subject.to_string(), supplied(schema)) {
            Ok(ok) => Ok(ok),
            Err(e) if not_found(&e) => Ok(true),
            Err(e) => Err(format!(
                "the registry at {} cannot check subject `{subject}`: {}",
                self.inner.url,
                message(&e)
            )),
        }
    }

    /// Whether the registry answers (its subject list).
    pub fn ping(&self) -> Result<(), String> {
        let Some(settings) = &self.inner.settings else {
            return Ok(());
        };
        schema_registry_converter::blocking::schema_registry::get_all_subjects(settings)
            .map(|_| ())
            .map_err(|e| {
                format!(
                    "the registry at {} does not answer: {}",
                    self.inner.url,
                    message(&e)
                )
            })
    }
}

/// The converter's form of `schema`, with its references (each registered under its own
/// subject, as the registry requires).
fn supplied(schema: &Registered) -> SuppliedSchema {
    SuppliedSchema::new(None, schema.format.schema_type(), schema.text.clone()).with_references(
        schema
            .references
            .iter()
            .map(|r| SuppliedReference::new(r.name.clone(), r.subject.clone(), r.text.clone()))
            .collect(),
    )
}

/// The references of `schema` as the registry's lookup takes them (each subject's latest).
fn references_json(schema: &Registered) -> serde_json::Value {
    schema
        .references
        .iter()
        .map(|r| serde_json::json!({"name": r.name, "subject": r.subject, "version": -1}))
        .collect()
}

/// The Avro schema as JSON text, logical types, defaults and aliases included (Avro's Parsing
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

fn lock<T>(l: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock still holds a whole value: each is set whole.
    l.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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
    fn a_registry_that_does_not_answer_holds_a_look_up_for_the_short_wait_only() {
        // Accepts connections and never answers, as a registry stopped with SIGSTOP does.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&accepted);
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for conn in listener.incoming() {
                counted.fetch_add(1, Ordering::SeqCst);
                held.push(conn);
            }
        });
        let r = Registry::connect(&SchemaRegistry {
            url,
            username: None,
            password: None,
            timeout_ms: 1_500,
        })
        .unwrap();
        let started = std::time::Instant::now();
        let first = r.schema(1, Format::Avro).unwrap_err();
        let waited = started.elapsed();
        assert!(
            matches!(&first, Lookup::Unavailable(m) if m.contains("not answered yet")),
            "{first:?}"
        );
        assert!(
            waited >= FETCH_WAIT && waited < FETCH_WAIT * 4,
            "{waited:?}"
        );
        // The fetch still running: the next look-up does not wait, nor ask again.
        let started = std::time::Instant::now();
        assert!(matches!(
            r.schema(1, Format::Avro),
            Err(Lookup::Unavailable(_))
        ));
        assert!(
            started.elapsed() < FETCH_WAIT / 2,
            "{:?}",
            started.elapsed()
        );
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        // Once it has timed out, a look-up asks again.
        std::thread::sleep(Duration::from_millis(1_700));
        assert!(matches!(
            r.schema(1, Format::Avro),
            Err(Lookup::Unavailable(_))
        ));
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn each_answer_of_the_registry_is_a_schema_the_records_fault_or_a_transient_failure() {
        let (url, calls) = double();
        let r = client(&url, "p");
        // Fetched once, then from the cache.
        assert!(r.schema(1, Format::Avro).is_ok());
        assert!(r.schema(1, Format::Avro).is_ok());
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // 404: the record's fault, remembered.
        let unknown = r.schema(2, Format::Avro).unwrap_err();
        assert!(
            matches!(&unknown, Lookup::Unknown(m) if m.contains("schema id 2 is unknown")),
            "{unknown:?}"
        );
        assert!(matches!(r.schema(2, Format::Avro), Err(Lookup::Unknown(_))));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        // 500: transient, asked again next time.
        assert!(
            matches!(r.schema(3, Format::Avro), Err(Lookup::Unavailable(m)) if m.contains("boom"))
        );
        assert!(matches!(
            r.schema(3, Format::Avro),
            Err(Lookup::Unavailable(_))
        ));
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        // Refused credentials: transient (the record is good), with the registry's words.
        let refused = client(&url, "wrong").schema(1, Format::Avro).unwrap_err();
        assert!(
            matches!(&refused, Lookup::Unavailable(m) if m.contains("Unauthorized")),
            "{refused:?}"
        );
        // Nobody listening: transient.
        let gone = client("http://127.0.0.1:1", "p")
            .schema(1, Format::Avro)
            .unwrap_err();
        assert!(matches!(gone, Lookup::Unavailable(_)), "{gone:?}");
    }
}
