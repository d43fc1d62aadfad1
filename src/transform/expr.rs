//! Expressions: CEL (the Common Expression Language), compiled once when a pipeline is
//! compiled, never per record.
//!
//! Why CEL (the `cel` crate) and not VRL: CEL is a small, side-effect-free, non-Turing-complete
//! language with a published specification, made for exactly this (predicates and field
//! computations over a record; Kubernetes, Envoy and Google's policy engines use it); the
//! crate is pure Rust with a handful of dependencies. VRL is a whole remapping language whose
//! standard library pulls in hundreds of crates (and C libraries through its grok/regex
//! support), a much heavier build for features a stream processor's per-record predicates do
//! not need; without its stdlib it has little left. CEL's semantics are also strict in a way
//! that suits exactly-once processing: a missing field or a type mismatch is an error we can
//! report as permanent, rather than a silent null.
//!
//! Speed: nothing is bound up front. Variables are resolved on access by a resolver over the
//! record (the crate's `VariableResolver`); CEL resolves `value.status` as a qualified name
//! first, so the resolver answers it with that one field of the lazily decoded document
//! ([`Doc`]), strings borrowed, not copied. Only an expression that uses `value` as a
//! whole (`size(value)`, `value[k]`) gets the whole document converted.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, OnceLock};

use cel::common::ast::{EntryExpr, Expr as Ast};
use cel::common::types::{
    CelBool, CelBytes, CelDouble, CelInt, CelList, CelMap, CelMapKey, CelNull, CelString, CelUInt,
};
use cel::common::value::{CowVal, Val};
use cel::context::VariableResolver;
use cel::{Context, Env, ExecutionError, IdedExpr, Program, Value};
use serde_json::Value as Json;

use super::fast::{self, Fast, Scalar, value_path};
use crate::codec::json::{Doc, Field, type_name};
use crate::record::{ErrorKind, Origin};

/// The variables an expression can use.
pub const VARIABLES: &[&str] = &[
    "value",
    "key",
    "headers",
    "timestamp",
    "topic",
    "partition",
    "offset",
];

/// The CEL environment shared by every expression: the standard library with the strings,
/// math and lists extensions.
fn env() -> Arc<Env> {
    static ENV: OnceLock<Arc<Env>> = OnceLock::new();
    Arc::clone(ENV.get_or_init(|| {
        let mut env = Env::stdlib();
        // The extensions are fixed at build time; failing to add them is a bug of ours, and a
        // job must then still run with the standard library.
        let _ = env.add_extension(cel::extensions::strings);
        let _ = env.add_extension(cel::extensions::math);
        let _ = env.add_extension(cel::extensions::lists);
        Arc::new(env)
    }))
}

/// How an expression uses `value`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
enum ValueUse {
    #[default]
    Unused,
    /// Only the values at these paths are used (`value.a.b`, `has(value.c)`).
    Paths(Vec<Vec<String>>),
    /// As a whole.
    Whole,
}

/// What an expression references, found once at compile time.
#[derive(Debug, Clone, Default)]
struct Uses {
    value: ValueUse,
    key: bool,
    headers: bool,
    timestamp: bool,
    topic: bool,
    partition: bool,
    offset: bool,
}

/// A compiled expression.
pub struct Expression {
    /// `Some` when the expression is only a path into the value (`value.customer.id`): it is
    /// then looked up directly, without the interpreter.
    path: Option<Vec<String>>,
    /// `Some` when the expression has a shape evaluated natively ([`super::fast`]).
    fast: Option<Box<Fast>>,
    source: String,
    program: Program,
    env: Arc<Env>,
    uses: Uses,
}

/// What an expression evaluates against: one record's parts, borrowed.
pub struct Scope<'s, 'a> {
    /// The decoded value: JSON, or raw bytes.
    pub value: ValueRef<'s, 'a>,
    pub key: Option<&'s [u8]>,
    /// The key decoded by its input's `key_codec` (`json`, `avro`): what `key` is then.
    pub key_doc: Option<&'s Json>,
    pub headers: &'s [(String, Vec<u8>)],
    pub timestamp: Option<i64>,
    pub origin: &'s Origin,
    /// The key's state, in an `aggregate`'s `reduce` (`state`); `None` elsewhere.
    pub state: Option<&'s Json>,
}

/// A record value as expressions see it.
#[derive(Clone, Copy)]
pub enum ValueRef<'s, 'a> {
    /// A JSON document; `None` for a record without value (`null`).
    Json(Option<&'s Doc<'a>>),
    Raw(Option<&'s [u8]>),
}

/// What of the JSON value an expression needs prepared (see [`Doc::prepare`]) before it
/// runs.
pub enum Needs<'e> {
    Nothing,
    Paths(&'e [Vec<String>]),
    Whole,
}

impl std::fmt::Debug for Expression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Expression").field(&self.source).finish()
    }
}

impl Expression {
    /// Compiles `source`; the error says what is wrong, with its position in the expression.
    pub fn compile(source: &str) -> Result<Expression, String> {
        Expression::compile_with(source, &[])
    }

    /// [`Expression::compile`] where the variables `extra` are bound too (`state`, in an
    /// `aggregate`'s `reduce`).
    pub fn compile_with(source: &str, extra: &[&str]) -> Result<Expression, String> {
        let env = env();
        let program = env.compile(source).map_err(|e| {
            let detail = e.to_string().replace("ERROR: <input>:", "at ");
            format!(
                "`{source}` is not a valid CEL expression: {}",
                detail.replace('\n', " ")
            )
        })?;
        let mut uses = Uses::default();
        let mut unknown = BTreeSet::new();
        analyze(
            program.expression(),
            &mut Vec::new(),
            &mut uses,
            &mut unknown,
        );
        unknown.retain(|name: &String| !extra.contains(&name.as_str()));
        if !unknown.is_empty() {
            let names: Vec<String> = unknown.into_iter().collect();
            let available: Vec<&str> = VARIABLES.iter().chain(extra).copied().collect();
            return Err(format!(
                "`{source}` uses unknown variable(s) {}; available: {}",
                names.join(", "),
                available.join(", ")
            ));
        }
        let path = value_path(program.expression(), &[]).filter(|p| !p.is_empty());
        let fast = fast::compile(program.expression())
            .filter(fast::worth_it)
            .map(Box::new);
        Ok(Expression {
            path,
            fast,
            source: source.to_string(),
            program,
            env,
            uses,
        })
    }

    /// The source text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// What of the JSON value to prepare before evaluating.
    pub fn needs(&self) -> Needs<'_> {
        match &self.uses.value {
            ValueUse::Unused => Needs::Nothing,
            ValueUse::Paths(paths) => Needs::Paths(paths),
            ValueUse::Whole => Needs::Whole,
        }
    }

    /// Evaluates the expression on a record whose JSON value had what [`Expression::needs`]
    /// decoded.
    pub fn eval(&self, scope: &Scope<'_, '_>) -> Result<Value, ExecutionError> {
        let resolver = Resolver {
            scope,
            uses: &self.uses,
        };
        let mut ctx = Context::with_env(Arc::clone(&self.env));
        ctx.set_variable_resolver(&resolver);
        self.program.execute(&ctx)
    }

    /// Evaluates the expression to JSON (see [`to_json`]).
    pub fn eval_json(&self, scope: &Scope<'_, '_>) -> Result<Json, (ErrorKind, String)> {
        if let Some(found) = self.lookup(scope) {
            return found.map(|f| f.to_json());
        }
        if let Some(json) = self.quick(scope).and_then(Scalar::into_json) {
            return Ok(json);
        }
        let v = self.eval(scope).map_err(|e| self.failure(e))?;
        to_json(&v).map_err(|m| (ErrorKind::WrongType, format!("`{}`: {m}", self.source)))
    }

    /// Evaluates the expression to key or header bytes (see [`to_bytes`]).
    pub fn eval_bytes(
        &self,
        scope: &Scope<'_, '_>,
    ) -> Result<Option<Vec<u8>>, (ErrorKind, String)> {
        if let Some(found) = self.lookup(scope) {
            return found.map(|f| json_bytes(&f.to_json()));
        }
        if let Some(scalar) = self.quick(scope) {
            return Ok(scalar.into_bytes());
        }
        let v = self.eval(scope).map_err(|e| self.failure(e))?;
        to_bytes(&v).map_err(|m| (ErrorKind::WrongType, format!("`{}`: {m}", self.source)))
    }

    /// The kind and message of this expression failing on a record.
    pub fn failure(&self, err: ExecutionError) -> (ErrorKind, String) {
        use ExecutionError as E;
        let kind = match &err {
            E::NoSuchKey(_) => ErrorKind::MissingField,
            E::UnexpectedType { .. }
            | E::NoSuchOverload(_)
            | E::UnsupportedBinaryOperator(..)
            | E::ValuesNotComparable(..)
            | E::UnsupportedTargetType { .. }
            | E::NotSupportedAsMethod { .. }
            | E::UnsupportedIndex(..)
            | E::UnsupportedKeyType(_) => ErrorKind::WrongType,
            _ => ErrorKind::Expression,
        };
        (kind, format!("`{}` failed: {err}", self.source))
    }

    /// A path-only expression looked up in a JSON value: `None` when it does not apply (not
    /// a path, or no JSON value), and the interpreter must run.
    fn lookup<'x>(
        &self,
        scope: &Scope<'x, '_>,
    ) -> Option<Result<Found<'x, 'x>, (ErrorKind, String)>> {
        let path = self.path.as_ref()?;
        let ValueRef::Json(Some(doc)) = scope.value else {
            return None;
        };
        let missing = |part: &str| {
            Err((
                ErrorKind::MissingField,
                format!("`{}` failed: No such key: {part}", self.source),
            ))
        };
        let not_object = |what: &str| {
            Err((
                ErrorKind::WrongType,
                format!("`{}` failed: {what} has no fields", self.source),
            ))
        };
        let mut current = Found::Doc(doc);
        for part in path {
            current = match current {
                Found::Doc(Doc::Object(_)) => match current.doc_get(part) {
                    Some(f) => f,
                    None => return Some(missing(part)),
                },
                Found::Doc(Doc::Other(json)) | Found::Json(json) => match json {
                    Json::Object(map) => match map.get(part.as_str()) {
                        Some(v) => Found::Json(v),
                        None => return Some(missing(part)),
                    },
                    other => return Some(not_object(type_name(other))),
                },
                Found::Field(Field::Object(inner)) => match inner.get(part) {
                    Some(f) => Found::Field(f),
                    None => return Some(missing(part)),
                },
                Found::Field(Field::Value(json)) => match json {
                    Json::Object(map) => match map.get(part.as_str()) {
                        Some(v) => Found::Json(v),
                        None => return Some(missing(part)),
                    },
                    other => return Some(not_object(type_name(other))),
                },
                // Not opened: let the interpreter do it (and say what is wrong).
                Found::Field(Field::Raw(_)) => return None,
            };
        }
        Some(Ok(current))
    }

    /// The expression evaluated natively, when its shape and the record allow it.
    fn quick<'x>(&'x self, scope: &Scope<'x, '_>) -> Option<Scalar<'x>> {
        let fast = self.fast.as_deref()?;
        let ValueRef::Json(Some(doc)) = scope.value else {
            return None;
        };
        fast::eval(fast, doc)
    }

    /// Evaluates a predicate: `Ok(None)` when the result is not a bool.
    pub fn eval_bool(&self, scope: &Scope<'_, '_>) -> Result<Option<bool>, ExecutionError> {
        if let Some(scalar) = self.quick(scope) {
            return Ok(match scalar {
                Scalar::Bool(b) => Some(b),
                _ => None,
            });
        }
        let resolver = Resolver {
            scope,
            uses: &self.uses,
        };
        let mut ctx = Context::with_env(Arc::clone(&self.env));
        ctx.set_variable_resolver(&resolver);
        let result = Value::resolve_val(self.program.expression(), &ctx)?;
        Ok(result.downcast_ref::<CelBool>().map(|b| bool::from(*b)))
    }
}

/// What a path-only expression found.
enum Found<'x, 'a> {
    Doc(&'x Doc<'a>),
    Field(&'x Field<'a>),
    Json(&'x Json),
}

impl<'x, 'a> Found<'x, 'a> {
    fn doc_get(&self, key: &str) -> Option<Found<'x, 'a>> {
        match self {
            Found::Doc(doc) => doc.get(key).map(Found::Field),
            _ => None,
        }
    }

    fn to_json(&self) -> Json {
        match self {
            Found::Doc(doc) => doc.to_json(),
            Found::Field(f) => f.to_json(),
            Found::Json(j) => (*j).clone(),
        }
    }
}

/// JSON as key or header bytes, like [`to_bytes`] of the same value in CEL.
fn json_bytes(json: &Json) -> Option<Vec<u8>> {
    match json {
        Json::Null => None,
        Json::String(s) => Some(s.as_bytes().to_vec()),
        Json::Bool(b) => Some(b.to_string().into_bytes()),
        Json::Number(n) => Some(
            match (n.as_i64(), n.as_u64()) {
                (Some(i), _) => i.to_string(),
                (None, Some(u)) => u.to_string(),
                _ => n.as_f64().unwrap_or(f64::NAN).to_string(),
            }
            .into_bytes(),
        ),
        other => serde_json::to_vec(other).ok(),
    }
}

/// Resolves the variables of one evaluation on access.
struct Resolver<'r, 's, 'a> {
    scope: &'r Scope<'s, 'a>,
    uses: &'r Uses,
}

impl VariableResolver for Resolver<'_, '_, '_> {
    fn resolve<'b>(&'b self, variable: &str) -> Option<CowVal<'b, 'b>> {
        let scope = self.scope;
        if let Some(path) = variable.strip_prefix("value.") {
            return field_val(scope.value, path).map(CowVal::Owned);
        }
        let val: Box<dyn Val + 'b> = match variable {
            "value" => match &self.uses.value {
                ValueUse::Paths(paths) => value_val(scope.value, Some(paths.as_slice())),
                _ => value_val(scope.value, None),
            },
            "key" => match scope.key_doc {
                Some(doc) => json_val(doc),
                None => bytes_val(scope.key),
            },
            "headers" => {
                let map: HashMap<CelMapKey<'b>, Box<dyn Val + 'b>> = scope
                    .headers
                    .iter()
                    .map(|(k, v)| (CelMapKey::from(k.as_str()), bytes_val(Some(v))))
                    .collect();
                Box::new(CelMap::from(map))
            }
            "timestamp" => match scope.timestamp {
                Some(t) => Box::new(CelInt::from(t)),
                None => Box::new(CelNull),
            },
            "topic" => Box::new(CelString::from(&*scope.origin.topic)),
            "partition" => Box::new(CelInt::from(i64::from(scope.origin.partition))),
            "offset" => Box::new(CelInt::from(scope.origin.offset)),
            "state" => match scope.state {
                Some(state) => json_val(state),
                None => return None,
            },
            _ => return None,
        };
        Some(CowVal::Owned(val))
    }
}

/// `value.a.b` resolved directly: field `a` of the document, then `b` inside it. `None` when
/// absent: CEL then selects step by step and reports the missing key.
fn field_val<'b>(value: ValueRef<'b, '_>, path: &str) -> Option<Box<dyn Val + 'b>> {
    let ValueRef::Json(Some(doc)) = value else {
        return None;
    };
    let mut parts = path.split('.');
    let mut field = doc.get(parts.next()?)?;
    loop {
        let Some(part) = parts.next() else {
            return Some(field_to_val(field));
        };
        match field {
            Field::Object(inner) => field = inner.get(part)?,
            Field::Value(json) => {
                let mut current = json.as_object()?.get(part)?;
                for part in parts {
                    current = current.as_object()?.get(part)?;
                }
                return Some(json_val(current));
            }
            // Not prepared for this path (`Expression::needs`): let CEL select step by step.
            Field::Raw(_) => return None,
        }
    }
}

/// A field as a CEL value. A raw field that is not plain is only reachable here while CEL
/// reports a missing key, or tests presence: it stands as null.
fn field_to_val<'b>(field: &'b Field<'_>) -> Box<dyn Val + 'b> {
    match field {
        Field::Raw(raw) => raw_val(raw).unwrap_or_else(|| Box::new(CelNull)),
        Field::Object(doc) => doc_val(doc, None),
        Field::Value(json) => json_val(json),
    }
}

/// An object of the document as a CEL map; with `paths`, only the fields they start with.
fn doc_val<'b>(doc: &'b Doc<'_>, paths: Option<&'b [Vec<String>]>) -> Box<dyn Val + 'b> {
    match doc {
        Doc::Other(json) => json_val(json),
        Doc::Object(fields) => {
            let map: HashMap<CelMapKey<'b>, Box<dyn Val + 'b>> = match paths {
                Some(paths) => paths
                    .iter()
                    .filter_map(|p| p.first())
                    .filter_map(|k| {
                        doc.get(k)
                            .map(|f| (CelMapKey::from(k.as_str()), field_to_val(f)))
                    })
                    .collect(),
                None => fields
                    .iter()
                    .map(|(k, f)| (CelMapKey::from(k.as_ref()), field_to_val(f)))
                    .collect(),
            };
            Box::new(CelMap::from(map))
        }
    }
}

/// A plain raw JSON scalar (number, bool, null, string without escapes) as a CEL value.
fn raw_val(text: &str) -> Option<Box<dyn Val + '_>> {
    Some(match text.as_bytes().first()? {
        b'"' if !text.contains('\\') => Box::new(CelString::from(&text[1..text.len() - 1])),
        b't' => Box::new(CelBool::from(true)),
        b'f' => Box::new(CelBool::from(false)),
        b'n' => Box::new(CelNull),
        b'{' | b'[' | b'"' => return None,
        _ => {
            if let Ok(i) = text.parse::<i64>() {
                Box::new(CelInt::from(i))
            } else if let Ok(u) = text.parse::<u64>() {
                Box::new(CelUInt::from(u))
            } else {
                Box::new(CelDouble::from(text.parse::<f64>().ok()?))
            }
        }
    })
}

/// Collects what `e` references; `bound` holds the comprehension variables in scope.
fn analyze(e: &IdedExpr, bound: &mut Vec<String>, uses: &mut Uses, unknown: &mut BTreeSet<String>) {
    match &e.expr {
        Ast::Select(select) => {
            // `value.a.b` (or `has(value.a.b)`): only what is at that path is needed.
            let path = if select.test {
                value_path(&select.operand, bound).map(|mut p| {
                    p.push(select.field.clone());
                    p
                })
            } else {
                value_path(e, bound)
            };
            match (path, &mut uses.value) {
                (Some(_), ValueUse::Whole) => {}
                (Some(path), ValueUse::Paths(paths)) => {
                    if !paths.contains(&path) {
                        paths.push(path);
                    }
                }
                (Some(path), unused @ ValueUse::Unused) => *unused = ValueUse::Paths(vec![path]),
                (None, _) => analyze(&select.operand, bound, uses, unknown),
            }
        }
        Ast::Ident(name) => {
            if name.starts_with('@') || bound.iter().any(|b| b == name) {
                return;
            }
            match name.as_str() {
                "value" => uses.value = ValueUse::Whole,
                "key" => uses.key = true,
                "headers" => uses.headers = true,
                "timestamp" => uses.timestamp = true,
                "topic" => uses.topic = true,
                "partition" => uses.partition = true,
                "offset" => uses.offset = true,
                // Type names of the standard library (`type(x) == string`).
                "bool" | "int" | "uint" | "double" | "string" | "bytes" | "list" | "map"
                | "null_type" | "type" => {}
                other => {
                    unknown.insert(other.to_string());
                }
            }
        }
        Ast::Call(call) => {
            if let Some(target) = &call.target {
                analyze(target, bound, uses, unknown);
            }
            for arg in &call.args {
                analyze(arg, bound, uses, unknown);
            }
        }
        Ast::Comprehension(c) => {
            analyze(&c.iter_range, bound, uses, unknown);
            let depth = bound.len();
            bound.push(c.iter_var.clone());
            if let Some(v) = &c.iter_var2 {
                bound.push(v.clone());
            }
            bound.push(c.accu_var.clone());
            for part in [&c.accu_init, &c.loop_cond, &c.loop_step, &c.result] {
                analyze(part, bound, uses, unknown);
            }
            bound.truncate(depth);
        }
        Ast::List(list) => {
            for element in &list.elements {
                analyze(element, bound, uses, unknown);
            }
        }
        Ast::Map(map) => entries(&map.entries, bound, uses, unknown),
        Ast::Struct(s) => entries(&s.entries, bound, uses, unknown),
        Ast::Literal(_) | Ast::Unspecified => {}
    }
}

fn entries(
    entries: &[cel::common::ast::IdedEntryExpr],
    bound: &mut Vec<String>,
    uses: &mut Uses,
    unknown: &mut BTreeSet<String>,
) {
    for entry in entries {
        match &entry.expr {
            EntryExpr::StructField(f) => analyze(&f.value, bound, uses, unknown),
            EntryExpr::MapEntry(m) => {
                analyze(&m.key, bound, uses, unknown);
                analyze(&m.value, bound, uses, unknown);
            }
        }
    }
}

/// `value` as a CEL value: the whole document, or an object of the fields `paths` start with.
fn value_val<'b>(value: ValueRef<'b, '_>, paths: Option<&'b [Vec<String>]>) -> Box<dyn Val + 'b> {
    match value {
        ValueRef::Raw(bytes) => bytes_val(bytes),
        ValueRef::Json(None) => Box::new(CelNull),
        ValueRef::Json(Some(doc)) => doc_val(doc, paths),
    }
}

/// A JSON value as a CEL value; strings are borrowed. Integers are `int` (`uint` beyond
/// `int`'s range), other numbers `double`.
pub fn json_val(json: &Json) -> Box<dyn Val + '_> {
    match json {
        Json::Null => Box::new(CelNull),
        Json::Bool(b) => Box::new(CelBool::from(*b)),
        Json::Number(n) => {
            if let Some(i) = n.as_i64() {
                Box::new(CelInt::from(i))
            } else if let Some(u) = n.as_u64() {
                Box::new(CelUInt::from(u))
            } else {
                Box::new(CelDouble::from(n.as_f64().unwrap_or(f64::NAN)))
            }
        }
        Json::String(s) => Box::new(CelString::from(s.as_str())),
        Json::Array(items) => Box::new(CelList::from(
            items.iter().map(json_val).collect::<Vec<_>>(),
        )),
        Json::Object(obj) => Box::new(CelMap::from(
            obj.iter()
                .map(|(k, v)| (CelMapKey::from(k.as_str()), json_val(v)))
                .collect::<HashMap<_, _>>(),
        )),
    }
}

/// Bytes as a CEL value: a string when they are UTF-8, bytes otherwise, null when absent.
fn bytes_val(bytes: Option<&[u8]>) -> Box<dyn Val + '_> {
    match bytes {
        None => Box::new(CelNull),
        Some(b) => match std::str::from_utf8(b) {
            Ok(s) => Box::new(CelString::from(s)),
            Err(_) => Box::new(CelBytes::from(b)),
        },
    }
}

/// A CEL result as JSON. Bytes, durations and timestamps have no JSON form: an error names
/// the type (convert with `string(...)`).
pub fn to_json(value: &Value) -> Result<Json, String> {
    Ok(match value {
        Value::Null => Json::Null,
        Value::Bool(b) => Json::Bool(*b),
        Value::Int(i) => Json::from(*i),
        Value::UInt(u) => Json::from(*u),
        Value::Float(f) => serde_json::Number::from_f64(*f)
            .map(Json::Number)
            .ok_or_else(|| format!("{f} cannot be written as JSON"))?,
        Value::String(s) => Json::String(s.as_str().to_string()),
        Value::List(items) => Json::Array(items.iter().map(to_json).collect::<Result<_, _>>()?),
        Value::Map(map) => {
            let mut obj = serde_json::Map::with_capacity(map.map.len());
            for (k, v) in map.map.iter() {
                let key = match k {
                    cel::objects::Key::String(s) => s.as_str().to_string(),
                    cel::objects::Key::Int(i) => i.to_string(),
                    cel::objects::Key::Uint(u) => u.to_string(),
                    cel::objects::Key::Bool(b) => b.to_string(),
                };
                obj.insert(key, to_json(v)?);
            }
            Json::Object(obj)
        }
        other => {
            return Err(format!(
                "a {} has no JSON form; convert it, e.g. with string(...)",
                other.type_of()
            ));
        }
    })
}

/// A CEL result as key or header bytes: a string as UTF-8, a number in decimal, bytes as
/// they are, null as none, lists and maps as JSON text.
pub fn to_bytes(value: &Value) -> Result<Option<Vec<u8>>, String> {
    Ok(match value {
        Value::Null => None,
        Value::String(s) => Some(s.as_bytes().to_vec()),
        Value::Bytes(b) => Some(b.to_vec()),
        Value::Int(i) => Some(i.to_string().into_bytes()),
        Value::UInt(u) => Some(u.to_string().into_bytes()),
        Value::Float(f) => Some(f.to_string().into_bytes()),
        Value::Bool(b) => Some(b.to_string().into_bytes()),
        other => Some(serde_json::to_vec(&to_json(other)?).map_err(|e| e.to_string())?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin() -> Origin {
        Origin {
            topic: "in".into(),
            partition: 3,
            offset: 42,
        }
    }

    fn eval(src: &str, value: &Json) -> Result<Value, ExecutionError> {
        let origin = origin();
        let headers = vec![("h".to_string(), b"v".to_vec())];
        let text = value.to_string();
        let mut doc = Doc::parse(text.as_bytes()).unwrap();
        let e = Expression::compile(src).unwrap();
        match e.needs() {
            Needs::Nothing => {}
            Needs::Whole => doc.decode_all(),
            Needs::Paths(paths) => paths.iter().for_each(|p| doc.prepare(p)),
        }
        let scope = Scope {
            value: ValueRef::Json(Some(&doc)),
            key: Some(b"k1"),
            key_doc: None,
            headers: &headers,
            timestamp: Some(1000),
            origin: &origin,
            state: None,
        };
        e.eval(&scope)
    }

    #[test]
    fn only_selected_fields_are_bound() {
        let e = Expression::compile("value.a > 1 && has(value.b) && value.c.d == 'x'").unwrap();
        let path = |p: &str| p.split('.').map(str::to_string).collect::<Vec<_>>();
        assert_eq!(
            e.uses.value,
            ValueUse::Paths(vec![path("a"), path("b"), path("c.d")])
        );
        let e = Expression::compile("size(value) > 1").unwrap();
        assert_eq!(e.uses.value, ValueUse::Whole);
        let e = Expression::compile("[1,2].exists(value, value > 1)").unwrap();
        assert_eq!(e.uses.value, ValueUse::Unused);
    }

    #[test]
    fn evaluates_against_the_record() {
        let v = serde_json::json!({"a": 2, "b": null, "c": {"d": "x"}, "items": [1, 2, 3]});
        assert_eq!(
            eval("value.a > 1 && has(value.b) && value.c.d == 'x'", &v),
            Ok(Value::Bool(true))
        );
        assert_eq!(
            eval("value.items.exists(i, i == 3)", &v),
            Ok(Value::Bool(true))
        );
        assert_eq!(eval("size(value)", &v), Ok(Value::Int(4)));
        assert_eq!(
            eval(
                "key + '@' + topic + ':' + string(partition) + ':' + string(offset)",
                &v
            ),
            Ok(Value::String(Arc::new("k1@in:3:42".into())))
        );
        assert_eq!(
            eval("headers.h", &v),
            Ok(Value::String(Arc::new("v".into())))
        );
        assert_eq!(eval("timestamp", &v), Ok(Value::Int(1000)));
    }

    #[test]
    fn missing_fields_and_wrong_types_fail() {
        let v = serde_json::json!({"a": "text"});
        assert!(matches!(
            eval("value.nope == 1", &v),
            Err(ExecutionError::NoSuchKey(_))
        ));
        assert!(eval("value.a + 1", &v).is_err());
    }

    #[test]
    fn unknown_variables_and_syntax_errors_are_compile_errors() {
        let err = Expression::compile("valu.a == 1").unwrap_err();
        assert!(err.contains("valu"), "{err}");
        let err = Expression::compile("value.a ==").unwrap_err();
        assert!(err.contains("not a valid CEL expression"), "{err}");
    }

    /// Every shape the native evaluator takes, over operands of every JSON type (and missing
    /// ones): wherever it answers, the interpreter answers the same, as JSON, as bytes and as
    /// a predicate; and it answers often enough to be worth having.
    #[test]
    fn native_shapes_agree_with_the_interpreter() {
        const EXPRESSIONS: &[&str] = &[
            "value.a == value.b",
            "value.a != value.b",
            "value.a < value.b",
            "value.a <= value.b",
            "value.a > value.b",
            "value.a >= value.b",
            "value.a == 'paid'",
            "value.a != 'test' && value.b > 0.0",
            "value.a > 0 || value.b == null",
            "value.a == true && !(value.b == false)",
            "!(value.a == value.b)",
            "value.a + value.b",
            "'order.' + value.a",
            "string(value.a)",
            "string(value.a) + '-' + string(value.b)",
            "value.a.upperAscii()",
            "value.b.lowerAscii()",
            "value.n.s == 'paid' && value.n.t >= 3",
            "value.n.s + value.a",
            "value.a == null",
            "value.a < 'm'",
        ];
        let operands = [
            r#"1"#,
            r#"-5"#,
            r#"0"#,
            r#"9223372036854775807"#,
            r#"18446744073709551615"#,
            r#"2.5"#,
            r#"-0.0"#,
            r#"1e300"#,
            r#""x""#,
            r#""paid""#,
            r#""test""#,
            r#""a\"b""#,
            r#""ÄÖ é""#,
            r#"true"#,
            r#"false"#,
            r#"null"#,
            r#"{"c":1}"#,
            r#"[1]"#,
            "missing",
        ];
        let origin = origin();
        let (mut native, mut total) = (0, 0);
        for src in EXPRESSIONS {
            let e = Expression::compile(src).unwrap();
            assert!(e.fast.is_some(), "`{src}` is a native shape");
            for a in operands {
                for b in operands {
                    let mut fields = vec![r#""n":{"s":"paid","t":3}"#.to_string()];
                    for (name, v) in [("a", a), ("b", b)] {
                        if v != "missing" {
                            fields.push(format!(r#""{name}":{v}"#));
                        }
                    }
                    let text = format!("{{{}}}", fields.join(","));
                    let mut doc =
                        Doc::parse(text.as_bytes()).unwrap_or_else(|e| panic!("{text}: {e}"));
                    if let Needs::Paths(paths) = e.needs() {
                        paths.iter().for_each(|p| doc.prepare(p));
                    }
                    let scope = Scope {
                        value: ValueRef::Json(Some(&doc)),
                        key: None,
                        key_doc: None,
                        headers: &[],
                        timestamp: None,
                        origin: &origin,
                        state: None,
                    };
                    total += 1;
                    let Some(quick) = e.quick(&scope) else {
                        continue;
                    };
                    native += 1;
                    let interpreted = e.eval(&scope).unwrap_or_else(|err| {
                        panic!("`{src}` on {text}: native {quick:?}, interpreter {err}")
                    });
                    let why = format!("`{src}` on {text}");
                    assert_eq!(quick.to_json(), to_json(&interpreted).ok(), "{why}");
                    assert_eq!(Some(quick.to_bytes()), to_bytes(&interpreted).ok(), "{why}");
                    assert_eq!(
                        e.eval_json(&scope).ok(),
                        to_json(&interpreted).ok(),
                        "{why}"
                    );
                    assert_eq!(
                        e.eval_bool(&scope).unwrap(),
                        match interpreted {
                            Value::Bool(b) => Some(b),
                            _ => None,
                        },
                        "{why}"
                    );
                }
            }
        }
        assert!(
            native * 5 > total,
            "native on {native} of {total} evaluations only"
        );
    }

    #[test]
    fn path_only_expressions_are_looked_up_like_the_interpreter_would() {
        let v = serde_json::json!({"a": {"b": 1.5, "c": "x"}, "n": 7, "s": "t"});
        let text = v.to_string();
        let mut doc = Doc::parse(text.as_bytes()).unwrap();
        let origin = origin();
        for (src, json, bytes) in [
            ("value.a.b", serde_json::json!(1.5), Some(b"1.5".to_vec())),
            ("value.a.c", serde_json::json!("x"), Some(b"x".to_vec())),
            ("value.n", serde_json::json!(7), Some(b"7".to_vec())),
            ("value.a", serde_json::json!({"b": 1.5, "c": "x"}), None),
        ] {
            let e = Expression::compile(src).unwrap();
            assert!(e.path.is_some(), "{src}");
            if let Needs::Paths(paths) = e.needs() {
                paths.iter().for_each(|p| doc.prepare(p));
            }
            let scope = Scope {
                value: ValueRef::Json(Some(&doc)),
                key: None,
                key_doc: None,
                headers: &[],
                timestamp: None,
                origin: &origin,
                state: None,
            };
            assert_eq!(e.eval_json(&scope).unwrap(), json, "{src}");
            let interpreted = to_json(&e.eval(&scope).unwrap()).unwrap();
            assert_eq!(interpreted, json, "{src}");
            if let Some(bytes) = bytes {
                assert_eq!(e.eval_bytes(&scope).unwrap(), Some(bytes.clone()), "{src}");
                assert_eq!(
                    to_bytes(&e.eval(&scope).unwrap()).unwrap(),
                    Some(bytes),
                    "{src}"
                );
            }
        }
        let scope = Scope {
            value: ValueRef::Json(Some(&doc)),
            key: None,
            key_doc: None,
            headers: &[],
            timestamp: None,
            origin: &origin,
            state: None,
        };
        let e = Expression::compile("value.nope.x").unwrap();
        assert_eq!(e.eval_json(&scope).unwrap_err().0, ErrorKind::MissingField);
        let e = Expression::compile("value.s.x").unwrap();
        assert_eq!(e.eval_json(&scope).unwrap_err().0, ErrorKind::WrongType);
    }

    #[test]
    fn results_convert_to_json_and_bytes() {
        let v = serde_json::json!({"a": 2});
        let r = eval("{'x': [value.a, 1.5, 'y', null, true]}", &v).unwrap();
        assert_eq!(
            to_json(&r).unwrap(),
            serde_json::json!({"x": [2, 1.5, "y", null, true]})
        );
        assert_eq!(to_bytes(&Value::Int(7)).unwrap(), Some(b"7".to_vec()));
        assert_eq!(to_bytes(&Value::Null).unwrap(), None);
    }
}
