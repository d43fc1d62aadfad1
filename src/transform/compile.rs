//! Compiling a topology's pipeline: its expressions, its steps, route targets resolved to
//! output indexes, every problem found reported at once.

use std::collections::HashMap;

use super::aggregate::Aggregate;
use super::dedupe::Dedupe;
use super::delay::Delay;
use super::expr::Expression;
use super::join::Join;
use super::window::Window;
use super::{HeaderValue, OutputSpec, Route, Step, split};
use crate::codec::Encoder;
use crate::topology::{
    AggregateConfig, ConfigIssue, Processor, RouteConfig, SetHeaderConfig, Topology,
};

/// What [`super::Pipeline::compile`] keeps while it goes through a topology.
pub(super) struct Compiler<'t> {
    /// Output names to output indexes.
    output_index: HashMap<&'t str, usize>,
    /// Problems of expressions, in the order found.
    issues: Vec<ConfigIssue>,
    /// Route targets that name no output, reported after the problems of expressions.
    unknown_outputs: Vec<ConfigIssue>,
    /// Stateful steps compiled so far: the next one's store index.
    stores: usize,
    /// The producer's `message.max.bytes`.
    max_message_bytes: usize,
}

impl<'t> Compiler<'t> {
    pub(super) fn new(topology: &'t Topology) -> Self {
        Compiler {
            output_index: topology
                .outputs
                .iter()
                .enumerate()
                .map(|(i, o)| (o.name(), i))
                .collect(),
            issues: Vec::new(),
            unknown_outputs: Vec::new(),
            stores: 0,
            max_message_bytes: topology.max_message_bytes(),
        }
    }

    /// Compiles `source`, found at `path`; `None` (and a problem) when it does not compile.
    fn expression(&mut self, path: String, source: &str) -> Option<Expression> {
        Expression::compile(source)
            .map_err(|message| self.issues.push(ConfigIssue { path, message }))
            .ok()
    }

    /// Compiles processor `p` (any but `route`, see [`Compiler::route`]), found at `here`.
    pub(super) fn step(&mut self, here: String, p: &Processor) -> Option<Step> {
        match p {
            Processor::Filter(src) => self.expression(here, src).map(Step::Filter),
            Processor::Map(fields) => {
                let compiled: Vec<_> = fields
                    .iter()
                    .map(|(f, src)| {
                        self.expression(format!("{here}.{f}"), src)
                            .map(|e| (split(f), e))
                    })
                    .collect();
                compiled
                    .into_iter()
                    .collect::<Option<Vec<_>>>()
                    .map(Step::Map)
            }
            Processor::DropFields(fields) => {
                Some(Step::DropFields(fields.iter().map(|f| split(f)).collect()))
            }
            Processor::Rename(map) => Some(Step::Rename(
                map.iter().map(|(a, b)| (split(a), split(b))).collect(),
            )),
            Processor::SetKey(src) => self.expression(here, src).map(Step::SetKey),
            Processor::Dedupe(d) => {
                let store = self.stores;
                self.stores += 1;
                let id = match &d.id {
                    Some(src) => Some(self.expression(format!("{here}.id"), src)?),
                    None => None,
                };
                match d.within_ms() {
                    Ok(within_ms) => Some(Step::Dedupe(Dedupe {
                        store,
                        within_ms,
                        id,
                    })),
                    Err(message) => {
                        self.issues.push(ConfigIssue {
                            path: format!("{here}.within"),
                            message,
                        });
                        None
                    }
                }
            }
            Processor::Join(j) => {
                let store = self.stores;
                self.stores += 1;
                let key = match &j.key {
                    Some(src) => Some(self.expression(format!("{here}.key"), src)?),
                    None => None,
                };
                Some(Step::Join(Join {
                    store,
                    table: j.table.clone(),
                    global: j.global,
                    key,
                    into: split(&j.into),
                    on_miss: j.on_miss,
                }))
            }
            Processor::Aggregate(a) => self.aggregate(&here, a),
            Processor::Explode(e) => Some(Step::Explode {
                field: split(&e.field),
                into: split(e.into.as_deref().unwrap_or(&e.field)),
            }),
            Processor::SetHeader(SetHeaderConfig { name, value, expr }) => {
                let value = match (value, expr) {
                    (_, Some(src)) => self
                        .expression(format!("{here}.expr"), src)
                        .map(HeaderValue::Computed),
                    (Some(v), None) => Some(HeaderValue::Fixed(v.as_bytes().to_vec())),
                    (None, None) => None,
                };
                value.map(|value| Step::SetHeader {
                    name: name.clone(),
                    value,
                })
            }
            Processor::DropEmpty {} => Some(Step::DropEmpty),
            Processor::Delay(d) => self.delay(&here, d),
            Processor::Route(_) => None,
        }
    }

    /// Compiles a `delay` step, found at `here`; its store is the next index.
    fn delay(&mut self, here: &str, d: &crate::topology::DelayConfig) -> Option<Step> {
        let store = self.stores;
        self.stores += 1;
        let until = match &d.until {
            Some(src) => Some(self.expression(format!("{here}.until"), src)?),
            None => None,
        };
        match d.fixed_ms() {
            Ok(fixed_ms) => Some(Step::Delay(Delay {
                store,
                until,
                fixed_ms,
                max_bytes: self.max_message_bytes,
            })),
            Err((field, message)) => {
                self.issues.push(ConfigIssue {
                    path: format!("{here}.{field}"),
                    message,
                });
                None
            }
        }
    }

    /// Compiles an `aggregate` step, found at `here`; its store is the next index.
    fn aggregate(&mut self, here: &str, a: &AggregateConfig) -> Option<Step> {
        let store = self.stores;
        self.stores += 1;
        let mut compile = |field: &str, src: &Option<String>, extra: &[&str]| {
            src.as_deref().map(|src| {
                Expression::compile_with(src, extra)
                    .map_err(|message| {
                        self.issues.push(ConfigIssue {
                            path: format!("{here}.{field}"),
                            message,
                        })
                    })
                    .ok()
            })
        };
        let of = compile("of", &a.of, &[]);
        let reduce = compile("reduce", &a.reduce, &["state"]);
        let init = compile("init", &a.init, &[]);
        let delete = compile("delete", &a.delete, &[]);
        let time = a
            .window
            .as_ref()
            .and_then(|w| compile("window.time", &w.time, &[]));
        let window = match &a.window {
            None => None,
            Some(w) => match w.spec() {
                Ok(spec) => Some(Window {
                    spec,
                    time: match time {
                        Some(e) => Some(e?),
                        None => None,
                    },
                    late: w.late,
                    emit_final: a.emit == crate::topology::Emit::Final,
                    field: a.into.clone().unwrap_or_else(|| "value".into()),
                }),
                Err((field, message)) => {
                    self.issues.push(ConfigIssue {
                        path: format!("{here}.window.{field}"),
                        message,
                    });
                    return None;
                }
            },
        };
        // A compiled-out expression (None inside Some) was reported.
        let of = match (of, reduce) {
            (Some(e), _) | (None, Some(e)) => Some(e?),
            (None, None) => None,
        };
        let aggregate = Aggregate {
            store,
            op: a.op,
            of,
            init: match init {
                Some(e) => Some(e?),
                None => None,
            },
            delete: match delete {
                Some(e) => Some(e?),
                None => None,
            },
            into: a.into.as_deref().map(split),
        };
        Some(match window {
            Some(w) => Step::Window(Box::new((aggregate, w))),
            None => Step::Aggregate(Box::new(aggregate)),
        })
    }

    /// Compiles the `route` processor `r`, found at `here`, the `index`th of the pipeline.
    pub(super) fn route(&mut self, here: &str, index: usize, r: &RouteConfig) -> Option<Route> {
        let default = self.targets(format!("{here}.default"), &r.default);
        let targets: Vec<Vec<usize>> = r
            .routes
            .iter()
            .enumerate()
            .map(|(n, rule)| self.targets(format!("{here}.routes[{n}].to"), &rule.to))
            .collect();
        let rules: Vec<Option<(Expression, Vec<usize>)>> = r
            .routes
            .iter()
            .zip(targets)
            .enumerate()
            .map(|(n, (rule, to))| {
                self.expression(format!("{here}.routes[{n}].when"), &rule.when)
                    .map(|e| (e, to))
            })
            .collect();
        let rules = rules.into_iter().collect::<Option<Vec<_>>>()?;
        Some(Route {
            rules,
            default,
            mode: r.mode,
            index,
        })
    }

    /// The indexes of the outputs `names`, found at `path`; the names of no output are left
    /// out (and reported).
    fn targets(&mut self, path: String, names: &[String]) -> Vec<usize> {
        names
            .iter()
            .enumerate()
            .filter_map(|(t, n)| {
                let found = self.output_index.get(n.as_str()).copied();
                if found.is_none() {
                    self.unknown_outputs.push(ConfigIssue {
                        path: format!("{path}[{t}]"),
                        message: format!("no output is named `{n}`"),
                    });
                }
                found
            })
            .collect()
    }

    /// The outputs of `topology`: their encoders and compiled keys.
    pub(super) fn outputs(
        &mut self,
        topology: &Topology,
        encoders: Vec<Box<dyn Encoder>>,
        key_encoders: Vec<Option<Box<dyn Encoder>>>,
    ) -> Vec<OutputSpec> {
        let mut outputs = Vec::new();
        for (((i, o), encoder), key_encoder) in topology
            .outputs
            .iter()
            .enumerate()
            .zip(encoders)
            .zip(key_encoders)
        {
            let key = o
                .key
                .as_deref()
                .and_then(|src| self.expression(format!("outputs[{i}].key"), src));
            outputs.push(OutputSpec {
                name: o.name().to_string(),
                encoder,
                key_encoder,
                key,
                headers: o.headers,
            });
        }
        outputs
    }

    /// Every problem found, in the order reported.
    pub(super) fn into_issues(self) -> Vec<ConfigIssue> {
        let mut issues = self.issues;
        issues.extend(self.unknown_outputs);
        issues
    }
}
