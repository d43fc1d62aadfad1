//! The common shapes of expressions evaluated without the CEL interpreter: field paths into
//! the value, literals, comparisons, `&&`, `||`, `!`, `+` of strings and numbers,
//! `string(...)`, `upperAscii()`/`lowerAscii()`.
//!
//! It never decides anything the interpreter might decide otherwise: on any case outside
//! what it knows for certain (operands of different types, a missing field, a field not
//! decoded, an overflow, a NaN, a string with escapes still raw) it answers `None`, and the
//! interpreter runs as before and gives the result or the error. A differential test holds
//! it to the interpreter's results.

use std::borrow::Cow;

use cel::IdedExpr;
use cel::common::ast::{Expr as Ast, LiteralValue, operators};
use serde_json::Value as Json;

use crate::codec::json::{Doc, Field};

/// An expression of a shape evaluated natively.
#[derive(Debug, Clone, PartialEq)]
pub enum Fast {
    Literal(Lit),
    /// `value.a.b`.
    Path(Vec<String>),
    Compare(Op, Box<Fast>, Box<Fast>),
    And(Box<Fast>, Box<Fast>),
    Or(Box<Fast>, Box<Fast>),
    Not(Box<Fast>),
    Add(Box<Fast>, Box<Fast>),
    /// `string(x)`.
    Text(Box<Fast>),
    Upper(Box<Fast>),
    Lower(Box<Fast>),
}

/// A literal of the expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Lit {
    Str(String),
    Int(i64),
    UInt(u64),
    Double(f64),
    Bool(bool),
    Null,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// A value met while evaluating, borrowed from the document where it can be.
#[derive(Debug, Clone, PartialEq)]
pub enum Scalar<'x> {
    Str(Cow<'x, str>),
    Int(i64),
    UInt(u64),
    Double(f64),
    Bool(bool),
    Null,
}

/// The shape of `e`, when it is one evaluated natively throughout.
pub fn compile(e: &IdedExpr) -> Option<Fast> {
    match &e.expr {
        Ast::Literal(lit) => Some(Fast::Literal(match lit {
            LiteralValue::String(s) => Lit::Str(s.inner().to_string()),
            LiteralValue::Int(i) => Lit::Int(*i.inner()),
            LiteralValue::UInt(u) => Lit::UInt(*u.inner()),
            LiteralValue::Double(d) => Lit::Double(*d.inner()),
            LiteralValue::Boolean(b) => Lit::Bool(*b.inner()),
            LiteralValue::Null => Lit::Null,
            LiteralValue::Bytes(_) => return None,
        })),
        Ast::Select(_) => value_path(e, &[]).filter(|p| !p.is_empty()).map(Fast::Path),
        Ast::Call(call) => {
            let arg = |i: usize| call.args.get(i).and_then(compile).map(Box::new);
            match (call.func_name.as_str(), &call.target, call.args.len()) {
                (name, None, 2) => {
                    let (a, b) = (arg(0)?, arg(1)?);
                    Some(match name {
                        operators::EQUALS => Fast::Compare(Op::Eq, a, b),
                        operators::NOT_EQUALS => Fast::Compare(Op::Ne, a, b),
                        operators::LESS => Fast::Compare(Op::Lt, a, b),
                        operators::LESS_EQUALS => Fast::Compare(Op::Le, a, b),
                        operators::GREATER => Fast::Compare(Op::Gt, a, b),
                        operators::GREATER_EQUALS => Fast::Compare(Op::Ge, a, b),
                        operators::LOGICAL_AND => Fast::And(a, b),
                        operators::LOGICAL_OR => Fast::Or(a, b),
                        operators::ADD => Fast::Add(a, b),
                        _ => return None,
                    })
                }
                (operators::LOGICAL_NOT, None, 1) => Some(Fast::Not(arg(0)?)),
                ("string", None, 1) => Some(Fast::Text(arg(0)?)),
                ("upperAscii", Some(target), 0) => Some(Fast::Upper(Box::new(compile(target)?))),
                ("lowerAscii", Some(target), 0) => Some(Fast::Lower(Box::new(compile(target)?))),
                _ => None,
            }
        }
        _ => None,
    }
}

/// Whether evaluating `fast` natively is worth it: anything but a lone literal or path, which
/// have their own ways.
pub fn worth_it(fast: &Fast) -> bool {
    !matches!(fast, Fast::Literal(_) | Fast::Path(_))
}

/// Evaluates `fast` over the document; `None` where the interpreter must decide.
pub fn eval<'x>(fast: &'x Fast, doc: &'x Doc<'_>) -> Option<Scalar<'x>> {
    Some(match fast {
        Fast::Literal(lit) => match lit {
            Lit::Str(s) => Scalar::Str(Cow::Borrowed(s)),
            Lit::Int(i) => Scalar::Int(*i),
            Lit::UInt(u) => Scalar::UInt(*u),
            Lit::Double(d) => Scalar::Double(*d),
            Lit::Bool(b) => Scalar::Bool(*b),
            Lit::Null => Scalar::Null,
        },
        Fast::Path(path) => at(doc, path)?,
        Fast::Compare(op, a, b) => Scalar::Bool(compare(*op, &eval(a, doc)?, &eval(b, doc)?)?),
        // CEL's `&&` and `||` absorb an error on either side when the other decides: only a
        // left side that is a bool and decides, or two bools, are decided here.
        Fast::And(a, b) => match eval(a, doc)? {
            Scalar::Bool(false) => Scalar::Bool(false),
            Scalar::Bool(true) => match eval(b, doc)? {
                Scalar::Bool(v) => Scalar::Bool(v),
                _ => return None,
            },
            _ => return None,
        },
        Fast::Or(a, b) => match eval(a, doc)? {
            Scalar::Bool(true) => Scalar::Bool(true),
            Scalar::Bool(false) => match eval(b, doc)? {
                Scalar::Bool(v) => Scalar::Bool(v),
                _ => return None,
            },
            _ => return None,
        },
        Fast::Not(a) => match eval(a, doc)? {
            Scalar::Bool(v) => Scalar::Bool(!v),
            _ => return None,
        },
        Fast::Add(a, b) => match (eval(a, doc)?, eval(b, doc)?) {
            (Scalar::Str(x), Scalar::Str(y)) => {
                let mut s = String::with_capacity(x.len() + y.len());
                s.push_str(&x);
                s.push_str(&y);
                Scalar::Str(Cow::Owned(s))
            }
            (Scalar::Int(x), Scalar::Int(y)) => Scalar::Int(x.checked_add(y)?),
            (Scalar::UInt(x), Scalar::UInt(y)) => Scalar::UInt(x.checked_add(y)?),
            _ => return None,
        },
        Fast::Text(a) => match eval(a, doc)? {
            Scalar::Str(s) => Scalar::Str(s),
            Scalar::Int(i) => Scalar::Str(Cow::Owned(i.to_string())),
            Scalar::UInt(u) => Scalar::Str(Cow::Owned(u.to_string())),
            Scalar::Bool(b) => Scalar::Str(Cow::Borrowed(if b { "true" } else { "false" })),
            _ => return None,
        },
        Fast::Upper(a) => match eval(a, doc)? {
            Scalar::Str(s) => Scalar::Str(Cow::Owned(s.to_ascii_uppercase())),
            _ => return None,
        },
        Fast::Lower(a) => match eval(a, doc)? {
            Scalar::Str(s) => Scalar::Str(Cow::Owned(s.to_ascii_lowercase())),
            _ => return None,
        },
    })
}

/// Same-typed comparisons only; NaN, mixed numeric types and ordered bools are left to the
/// interpreter.
fn compare(op: Op, a: &Scalar<'_>, b: &Scalar<'_>) -> Option<bool> {
    use std::cmp::Ordering;
    let ordering: Ordering = match (a, b) {
        (Scalar::Str(x), Scalar::Str(y)) => x.as_ref().cmp(y.as_ref()),
        (Scalar::Int(x), Scalar::Int(y)) => x.cmp(y),
        (Scalar::UInt(x), Scalar::UInt(y)) => x.cmp(y),
        (Scalar::Double(x), Scalar::Double(y)) => x.partial_cmp(y)?,
        (Scalar::Bool(x), Scalar::Bool(y)) if matches!(op, Op::Eq | Op::Ne) => x.cmp(y),
        (Scalar::Null, Scalar::Null) if matches!(op, Op::Eq | Op::Ne) => Ordering::Equal,
        _ => return None,
    };
    Some(match op {
        Op::Eq => ordering == Ordering::Equal,
        Op::Ne => ordering != Ordering::Equal,
        Op::Lt => ordering == Ordering::Less,
        Op::Le => ordering != Ordering::Greater,
        Op::Gt => ordering == Ordering::Greater,
        Op::Ge => ordering != Ordering::Less,
    })
}

/// The scalar at `path` of the document, when it is one and decoded (or plain raw text).
fn at<'x>(doc: &'x Doc<'_>, path: &[String]) -> Option<Scalar<'x>> {
    let (first, rest) = path.split_first()?;
    let mut field = doc.get(first)?;
    for (i, part) in rest.iter().enumerate() {
        match field {
            Field::Object(inner) => field = inner.get(part)?,
            Field::Value(json) => {
                let mut current = json.as_object()?.get(part)?;
                for part in &rest[i + 1..] {
                    current = current.as_object()?.get(part)?;
                }
                return json_scalar(current);
            }
            Field::Raw(_) => return None,
        }
    }
    match field {
        Field::Raw(text) => raw_scalar(text),
        Field::Value(json) => json_scalar(json),
        Field::Object(_) => None,
    }
}

/// As the resolver maps JSON numbers: an i64 when it is one, else a u64, else a double.
fn json_scalar(json: &Json) -> Option<Scalar<'_>> {
    Some(match json {
        Json::Null => Scalar::Null,
        Json::Bool(b) => Scalar::Bool(*b),
        Json::String(s) => Scalar::Str(Cow::Borrowed(s)),
        Json::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Scalar::Int(i),
            (None, Some(u)) => Scalar::UInt(u),
            _ => Scalar::Double(n.as_f64()?),
        },
        Json::Array(_) | Json::Object(_) => return None,
    })
}

/// Plain raw JSON text as the resolver reads it; strings with escapes are left alone.
fn raw_scalar(text: &str) -> Option<Scalar<'_>> {
    Some(match text.as_bytes().first()? {
        b'"' if !text.contains('\\') && text.len() >= 2 => {
            Scalar::Str(Cow::Borrowed(&text[1..text.len() - 1]))
        }
        b't' if text == "true" => Scalar::Bool(true),
        b'f' if text == "false" => Scalar::Bool(false),
        b'n' if text == "null" => Scalar::Null,
        // A fraction or an exponent is never an integer: no integer parse tried for it.
        b'-' | b'0'..=b'9' if text.bytes().any(|c| matches!(c, b'.' | b'e' | b'E')) => {
            Scalar::Double(text.parse::<f64>().ok()?)
        }
        b'-' | b'0'..=b'9' => {
            if let Ok(i) = text.parse::<i64>() {
                Scalar::Int(i)
            } else if let Ok(u) = text.parse::<u64>() {
                Scalar::UInt(u)
            } else {
                Scalar::Double(text.parse::<f64>().ok()?)
            }
        }
        _ => return None,
    })
}

impl Scalar<'_> {
    /// As the interpreter's result converts to JSON; `None` for a double JSON cannot hold.
    pub fn to_json(&self) -> Option<Json> {
        Some(match self {
            Scalar::Str(s) => Json::String(s.to_string()),
            Scalar::Int(i) => Json::from(*i),
            Scalar::UInt(u) => Json::from(*u),
            Scalar::Double(d) => Json::Number(serde_json::Number::from_f64(*d)?),
            Scalar::Bool(b) => Json::Bool(*b),
            Scalar::Null => Json::Null,
        })
    }

    /// [`Scalar::to_json`], a string computed here moved rather than copied.
    pub fn into_json(self) -> Option<Json> {
        match self {
            Scalar::Str(Cow::Owned(s)) => Some(Json::String(s)),
            other => other.to_json(),
        }
    }

    /// [`Scalar::to_bytes`], a string computed here moved rather than copied.
    pub fn into_bytes(self) -> Option<Vec<u8>> {
        match self {
            Scalar::Str(Cow::Owned(s)) => Some(s.into_bytes()),
            other => other.to_bytes(),
        }
    }

    /// As the interpreter's result converts to key or header bytes.
    pub fn to_bytes(&self) -> Option<Vec<u8>> {
        match self {
            Scalar::Str(s) => Some(s.as_bytes().to_vec()),
            Scalar::Int(i) => Some(i.to_string().into_bytes()),
            Scalar::UInt(u) => Some(u.to_string().into_bytes()),
            Scalar::Double(d) => Some(d.to_string().into_bytes()),
            Scalar::Bool(b) => Some(b.to_string().into_bytes()),
            Scalar::Null => None,
        }
    }
}

/// The path of `e` when it is field selections on `value` (`value.a.b` gives `[a, b]`,
/// `value` itself `[]`).
pub(super) fn value_path(e: &IdedExpr, bound: &[String]) -> Option<Vec<String>> {
    let mut path = Vec::new();
    let mut current = e;
    loop {
        match &current.expr {
            Ast::Select(s) if !s.test => {
                path.push(s.field.clone());
                current = &s.operand;
            }
            Ast::Ident(name) if name == "value" && !bound.iter().any(|b| b == "value") => {
                path.reverse();
                return Some(path);
            }
            _ => return None,
        }
    }
}
