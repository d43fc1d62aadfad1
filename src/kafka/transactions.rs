//! What the brokers know about transactions (KIP-664), and the two ways to end one: fencing
//! its transactional id at the coordinator, and writing abort markers to the partitions of
//! an orphaned producer (as Kafka's own `kafka-transactions.sh abort` does).
//!
//! Each call goes to the broker that owns the answer: ListTransactions to every broker (each
//! lists the transactional ids it coordinates), DescribeTransactions and InitProducerId to
//! that coordinator, DescribeProducers, ListOffsets and WriteTxnMarkers to the partition's
//! leader, ListGroups to every broker and the group's description to its coordinator.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use kafka_protocol::ResponseError;
use kafka_protocol::messages::describe_producers_request::TopicRequest;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::write_txn_markers_request::{
    WritableTxnMarker, WritableTxnMarkerTopic,
};
use kafka_protocol::messages::{
    BrokerId, ConsumerGroupDescribeRequest, DescribeGroupsRequest, DescribeProducersRequest,
    DescribeTransactionsRequest, GroupId, InitProducerIdRequest, ListGroupsRequest,
    ListOffsetsRequest, ListTransactionsRequest, MetadataRequest, ProducerId, TopicName,
    TransactionalId, WriteTxnMarkersRequest,
};
use kafka_protocol::protocol::StrBytes;

use super::Cluster;
use super::wire::{Connection, Security, WireError};

/// A topic partition.
pub type Partition = (String, i32);

#[derive(Debug, thiserror::Error)]
pub enum TxnAdminError {
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error("no bootstrap server answered: {0}")]
    Bootstrap(String),
    /// The broker answered the request with an error code.
    #[error("{what}: {error}")]
    Broker { what: String, error: String },
    #[error("partition {0}-{1} has no leader")]
    NoLeader(String, i32),
    #[error("broker {0} is not in the cluster's metadata")]
    UnknownBroker(i32),
    #[error("{what}: still refused after {waited:?}: {error}")]
    Timeout {
        what: String,
        waited: Duration,
        error: String,
    },
}

fn error_text(code: i16) -> String {
    match ResponseError::try_from_code(code) {
        Some(e) => format!("{e:?} (error {code})"),
        None => format!("error {code}"),
    }
}

fn check(code: i16, what: impl FnOnce() -> String) -> Result<(), TxnAdminError> {
    if code == 0 {
        Ok(())
    } else {
        Err(TxnAdminError::Broker {
            what: what(),
            error: error_text(code),
        })
    }
}

fn text(s: &StrBytes) -> String {
    s.as_str().to_string()
}

/// A transaction as its coordinator lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedTransaction {
    pub transactional_id: String,
    pub producer_id: i64,
    pub state: String,
    /// The broker that coordinates it.
    pub coordinator: i32,
}

/// A transaction as its coordinator describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoordinatorTransaction {
    pub transactional_id: String,
    pub coordinator: i32,
    pub state: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub timeout_ms: i32,
    /// -1 when no transaction is open.
    pub start_time_ms: i64,
    pub partitions: Vec<Partition>,
}

/// A producer with state on a partition, as the partition's leader describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveProducer {
    pub producer_id: i64,
    pub producer_epoch: i32,
    /// When it last wrote to the partition (ms since the epoch).
    pub last_timestamp: i64,
    pub coordinator_epoch: i32,
    /// The first offset of its open transaction on the partition; -1 when none is open.
    pub txn_start_offset: i64,
}

/// A group member that names itself (`group.instance.id`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub instance_id: Option<String>,
    pub client_id: String,
    pub host: String,
}

fn member(instance_id: Option<&StrBytes>, client_id: &StrBytes, host: &StrBytes) -> Member {
    Member {
        instance_id: instance_id.map(text),
        client_id: text(client_id),
        host: text(host),
    }
}

/// Connections to every broker of a cluster, opened on first use, and its metadata.
pub struct TxnAdmin {
    security: Security,
    timeout: Duration,
    brokers: BTreeMap<i32, String>,
    leaders: BTreeMap<Partition, i32>,
    connections: HashMap<i32, Connection>,
}

impl TxnAdmin {
    /// Connects to the first bootstrap server that answers and reads the cluster's metadata
    /// (every topic).
    pub fn connect(cluster: &Cluster, timeout: Duration) -> Result<TxnAdmin, TxnAdminError> {
        let security = Security::from_settings(&cluster.settings)?;
        let mut failures = Vec::new();
        for addr in cluster.bootstrap.split(',').map(str::trim) {
            if addr.is_empty() {
                continue;
            }
            match Connection::open(addr, &security, timeout) {
                Ok(connection) => {
                    let mut admin = TxnAdmin {
                        security,
                        timeout,
                        brokers: BTreeMap::new(),
                        leaders: BTreeMap::new(),
                        connections: HashMap::new(),
                    };
                    admin.refresh_metadata(connection)?;
                    return Ok(admin);
                }
                Err(e) => failures.push(e.to_string()),
            }
        }
        Err(TxnAdminError::Bootstrap(failures.join("; ")))
    }

    fn refresh_metadata(&mut self, mut connection: Connection) -> Result<(), TxnAdminError> {
        let metadata = connection.call(&MetadataRequest::default().with_topics(None))?;
        self.brokers = metadata
            .brokers
            .iter()
            .map(|b| (b.node_id.0, format!("{}:{}", b.host.as_str(), b.port)))
            .collect();
        self.leaders.clear();
        for topic in &metadata.topics {
            let Some(name) = &topic.name else { continue };
            if topic.error_code != 0 {
                continue;
            }
            for p in &topic.partitions {
                self.leaders
                    .insert((text(&name.0), p.partition_index), p.leader_id.0);
            }
        }
        // The bootstrap connection is kept when it is one of the brokers.
        if let Some((&id, _)) = self
            .brokers
            .iter()
            .find(|(_, addr)| addr.as_str() == connection.addr())
        {
            self.connections.insert(id, connection);
        }
        Ok(())
    }

    pub fn broker_ids(&self) -> Vec<i32> {
        self.brokers.keys().copied().collect()
    }

    /// Every partition of the topics the metadata lists, or of those named.
    pub fn partitions(&self, topics: Option<&BTreeSet<String>>) -> Vec<Partition> {
        self.leaders
            .keys()
            .filter(|(t, _)| topics.is_none_or(|set| set.contains(t)))
            .cloned()
            .collect()
    }

    pub fn topic_exists(&self, topic: &str) -> bool {
        self.leaders.keys().any(|(t, _)| t == topic)
    }

    fn connection(&mut self, broker: i32) -> Result<&mut Connection, TxnAdminError> {
        if !self.connections.contains_key(&broker) {
            let addr = self
                .brokers
                .get(&broker)
                .ok_or(TxnAdminError::UnknownBroker(broker))?;
            let connection = Connection::open(addr, &self.security, self.timeout)?;
            self.connections.insert(broker, connection);
        }
        // Just inserted when it was missing.
        self.connections
            .get_mut(&broker)
            .ok_or(TxnAdminError::UnknownBroker(broker))
    }

    fn leader(&self, partition: &Partition) -> Result<i32, TxnAdminError> {
        match self.leaders.get(partition) {
            Some(&leader) if leader >= 0 => Ok(leader),
            _ => Err(TxnAdminError::NoLeader(partition.0.clone(), partition.1)),
        }
    }

    /// Partitions grouped by their leader.
    fn by_leader(
        &self,
        partitions: &[Partition],
    ) -> Result<BTreeMap<i32, BTreeMap<String, Vec<i32>>>, TxnAdminError> {
        let mut grouped: BTreeMap<i32, BTreeMap<String, Vec<i32>>> = BTreeMap::new();
        for partition in partitions {
            let leader = self.leader(partition)?;
            grouped
                .entry(leader)
                .or_default()
                .entry(partition.0.clone())
                .or_default()
                .push(partition.1);
        }
        Ok(grouped)
    }

    /// Every transactional id every coordinator knows, with its state.
    pub fn list_transactions(&mut self) -> Result<Vec<ListedTransaction>, TxnAdminError> {
        let mut listed = Vec::new();
        for broker in self.broker_ids() {
            let response = self
                .connection(broker)?
                .call(&ListTransactionsRequest::default())?;
            check(response.error_code, || {
                format!("ListTransactions on broker {broker}")
            })?;
            listed.extend(
                response
                    .transaction_states
                    .iter()
                    .map(|t| ListedTransaction {
                        transactional_id: text(&t.transactional_id.0),
                        producer_id: t.producer_id.0,
                        state: text(&t.transaction_state),
                        coordinator: broker,
                    }),
            );
        }
        listed.sort_by(|a, b| a.transactional_id.cmp(&b.transactional_id));
        Ok(listed)
    }

    /// The coordinator's description of each listed transaction.
    pub fn describe_transactions(
        &mut self,
        listed: &[ListedTransaction],
    ) -> Result<Vec<CoordinatorTransaction>, TxnAdminError> {
        let mut by_coordinator: BTreeMap<i32, Vec<TransactionalId>> = BTreeMap::new();
        for t in listed {
            by_coordinator
                .entry(t.coordinator)
                .or_default()
                .push(TransactionalId(StrBytes::from_string(
                    t.transactional_id.clone(),
                )));
        }
        let mut described = Vec::new();
        for (coordinator, ids) in by_coordinator {
            let response = self
                .connection(coordinator)?
                .call(&DescribeTransactionsRequest::default().with_transactional_ids(ids))?;
            for t in response.transaction_states {
                // An id that moved or expired since it was listed is simply not described.
                if t.error_code != 0 {
                    tracing::debug!(
                        transactional_id = t.transactional_id.0.as_str(),
                        error = error_text(t.error_code),
                        "transaction not described"
                    );
                    continue;
                }
                described.push(CoordinatorTransaction {
                    transactional_id: text(&t.transactional_id.0),
                    coordinator,
                    state: text(&t.transaction_state),
                    producer_id: t.producer_id.0,
                    producer_epoch: t.producer_epoch,
                    timeout_ms: t.transaction_timeout_ms,
                    start_time_ms: t.transaction_start_time_ms,
                    partitions: t
                        .topics
                        .iter()
                        .flat_map(|topic| {
                            let name = text(&topic.topic.0);
                            topic.partitions.iter().map(move |&p| (name.clone(), p))
                        })
                        .collect(),
                });
            }
        }
        Ok(described)
    }

    /// The producers with state on each partition, as its leader describes them.
    pub fn describe_producers(
        &mut self,
        partitions: &[Partition],
    ) -> Result<BTreeMap<Partition, Vec<ActiveProducer>>, TxnAdminError> {
        let mut found = BTreeMap::new();
        for (leader, topics) in self.by_leader(partitions)? {
            let request = DescribeProducersRequest::default().with_topics(
                topics
                    .into_iter()
                    .map(|(name, indexes)| {
                        TopicRequest::default()
                            .with_name(TopicName(StrBytes::from_string(name)))
                            .with_partition_indexes(indexes)
                    })
                    .collect(),
            );
            let response = self.connection(leader)?.call(&request)?;
            for topic in response.topics {
                let name = text(&topic.name.0);
                for p in topic.partitions {
                    check(p.error_code, || {
                        format!("DescribeProducers {name}-{}", p.partition_index)
                    })?;
                    let producers = p
                        .active_producers
                        .iter()
                        .map(|s| ActiveProducer {
                            producer_id: s.producer_id.0,
                            producer_epoch: s.producer_epoch,
                            last_timestamp: s.last_timestamp,
                            coordinator_epoch: s.coordinator_epoch,
                            txn_start_offset: s.current_txn_start_offset,
                        })
                        .collect();
                    found.insert((name.clone(), p.partition_index), producers);
                }
            }
        }
        Ok(found)
    }

    /// Each partition's end offset: the high watermark when `committed` is false, the last
    /// stable offset (what read_committed consumers can reach) when true.
    pub fn end_offsets(
        &mut self,
        partitions: &[Partition],
        committed: bool,
    ) -> Result<BTreeMap<Partition, i64>, TxnAdminError> {
        let mut found = BTreeMap::new();
        for (leader, topics) in self.by_leader(partitions)? {
            let request = ListOffsetsRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_isolation_level(i8::from(committed))
                .with_topics(
                    topics
                        .into_iter()
                        .map(|(name, indexes)| {
                            ListOffsetsTopic::default()
                                .with_name(TopicName(StrBytes::from_string(name)))
                                .with_partitions(
                                    indexes
                                        .into_iter()
                                        .map(|i| {
                                            ListOffsetsPartition::default()
                                                .with_partition_index(i)
                                                .with_current_leader_epoch(-1)
                                                .with_timestamp(-1)
                                        })
                                        .collect(),
                                )
                        })
                        .collect(),
                );
            let response = self.connection(leader)?.call(&request)?;
            for topic in response.topics {
                let name = text(&topic.name.0);
                for p in topic.partitions {
                    check(p.error_code, || {
                        format!("ListOffsets {name}-{}", p.partition_index)
                    })?;
                    found.insert((name.clone(), p.partition_index), p.offset);
                }
            }
        }
        Ok(found)
    }

    /// The members of a consumer group (either protocol); `None` when no broker knows it.
    pub fn group_members(&mut self, group: &str) -> Result<Option<Vec<Member>>, TxnAdminError> {
        for broker in self.broker_ids() {
            let listed = self
                .connection(broker)?
                .call(&ListGroupsRequest::default())?;
            check(listed.error_code, || {
                format!("ListGroups on broker {broker}")
            })?;
            let Some(entry) = listed
                .groups
                .iter()
                .find(|g| g.group_id.0.as_str() == group)
            else {
                continue;
            };
            let id = GroupId(StrBytes::from_string(group.to_string()));
            if entry.group_type.as_str() == "consumer" {
                let described = self
                    .connection(broker)?
                    .call(&ConsumerGroupDescribeRequest::default().with_group_ids(vec![id]))?;
                let Some(g) = described.groups.first() else {
                    return Ok(None);
                };
                check(g.error_code, || format!("ConsumerGroupDescribe {group}"))?;
                return Ok(Some(
                    g.members
                        .iter()
                        .map(|m| member(m.instance_id.as_ref(), &m.client_id, &m.client_host))
                        .collect(),
                ));
            }
            let described = self
                .connection(broker)?
                .call(&DescribeGroupsRequest::default().with_groups(vec![id]))?;
            let Some(g) = described.groups.first() else {
                return Ok(None);
            };
            check(g.error_code, || format!("DescribeGroups {group}"))?;
            return Ok(Some(
                g.members
                    .iter()
                    .map(|m| member(m.group_instance_id.as_ref(), &m.client_id, &m.client_host))
                    .collect(),
            ));
        }
        Ok(None)
    }

    /// Ends a transactional id's open transaction at its coordinator the way a new producer
    /// incarnation does: InitProducerId with the same id bumps the epoch and has the
    /// coordinator abort what was open (and fences whoever held the id). Retried while the
    /// coordinator is still completing the abort.
    pub fn fence(
        &mut self,
        coordinator: i32,
        transactional_id: &str,
        timeout_ms: i32,
        wait: Duration,
    ) -> Result<(), TxnAdminError> {
        let request = InitProducerIdRequest::default()
            .with_transactional_id(Some(TransactionalId(StrBytes::from_string(
                transactional_id.to_string(),
            ))))
            .with_transaction_timeout_ms(timeout_ms.max(1))
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1);
        let started = Instant::now();
        loop {
            let response = self.connection(coordinator)?.call(&request)?;
            let code = response.error_code;
            if code == 0 {
                return Ok(());
            }
            let retriable = matches!(
                ResponseError::try_from_code(code),
                Some(
                    ResponseError::ConcurrentTransactions
                        | ResponseError::CoordinatorLoadInProgress
                        | ResponseError::CoordinatorNotAvailable
                )
            );
            if !retriable {
                return Err(TxnAdminError::Broker {
                    what: format!("InitProducerId {transactional_id}"),
                    error: error_text(code),
                });
            }
            if started.elapsed() > wait {
                return Err(TxnAdminError::Timeout {
                    what: format!("InitProducerId {transactional_id}"),
                    waited: wait,
                    error: error_text(code),
                });
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Writes an abort marker for `producer` to one partition, through its leader.
    pub fn write_abort_marker(
        &mut self,
        partition: &Partition,
        producer: &ActiveProducer,
    ) -> Result<(), TxnAdminError> {
        let leader = self.leader(partition)?;
        let epoch = i16::try_from(producer.producer_epoch).unwrap_or(i16::MAX);
        let request = WriteTxnMarkersRequest::default().with_markers(vec![
            WritableTxnMarker::default()
                .with_producer_id(ProducerId(producer.producer_id))
                .with_producer_epoch(epoch)
                .with_transaction_result(false)
                .with_coordinator_epoch(producer.coordinator_epoch.max(0))
                .with_topics(vec![
                    WritableTxnMarkerTopic::default()
                        .with_name(TopicName(StrBytes::from_string(partition.0.clone())))
                        .with_partition_indexes(vec![partition.1]),
                ]),
        ]);
        let response = self.connection(leader)?.call(&request)?;
        for marker in response.markers {
            for topic in marker.topics {
                for p in topic.partitions {
                    check(p.error_code, || {
                        format!(
                            "WriteTxnMarkers {}-{} producer {}",
                            partition.0, partition.1, producer.producer_id
                        )
                    })?;
                }
            }
        }
        Ok(())
    }
}
