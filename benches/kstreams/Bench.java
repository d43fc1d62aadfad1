// The Kafka Streams peer of `onceflow-bench`: the same pass-through map from one topic to
// another (or with `--workload count-by-key`, `groupByKey().count()` with its record cache
// off, so that every update is emitted as onceflow's `aggregate` does; with `--workload
// window-count`, a count per key in tumbling windows of `--window-ms` (no grace), final
// results only: `suppress(untilWindowCloses)`, as benches/window-count runs it), under
// exactly_once_v2, with the settings the bench passes so both sides match
// (commit interval, stream threads, producer linger.ms and batch.size).
//
// Run with the libraries that benches/kstreams/fetch downloads (no build needed):
//
//   java -cp '<libs>/*' benches/kstreams/Bench.java --bootstrap-servers 127.0.0.1:39292 \
//     --application-id bench-1 --input in --probe-input probe --output out --commit-interval-ms 100 \
//     --threads 1 --linger-ms 5 --batch-size 1000000 --state-dir /tmp/x
//
// It prints `onceflow-bench: running` on stdout once the instance is RUNNING, processes until
// SIGTERM (or, with `--stop-after-records N`, until it has taken N input records: it then
// closes, which commits them), then closes and prints one JSON line: the number of commits and each commit's
// duration in microseconds, from the first flush/sendOffsetsToTransaction of a commit to the
// end of its commitTransaction (onceflow's measure covers the same steps: wait for every
// delivery, send the offsets, commit).

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.Producer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Suppressed;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.processor.internals.DefaultKafkaClientSupplier;

public class Bench {
    /** Commit durations of every producer of this process, in microseconds. */
    static final List<Long> COMMITS_US = new ArrayList<>();

    /** A transactional producer that times each commit. */
    static final class TimedProducer extends KafkaProducer<byte[], byte[]> {
        private long commitStarted = -1;

        TimedProducer(Map<String, Object> config) {
            super(config, new ByteArraySerializer(), new ByteArraySerializer());
        }

        private void mark() {
            if (commitStarted < 0) {
                commitStarted = System.nanoTime();
            }
        }

        @Override
        public void flush() {
            mark();
            super.flush();
        }

        @Override
        public void sendOffsetsToTransaction(
                Map<TopicPartition, OffsetAndMetadata> offsets, ConsumerGroupMetadata metadata) {
            mark();
            super.sendOffsetsToTransaction(offsets, metadata);
        }

        @Override
        public void commitTransaction() {
            mark();
            super.commitTransaction();
            long us = (System.nanoTime() - commitStarted) / 1000;
            commitStarted = -1;
            synchronized (COMMITS_US) {
                COMMITS_US.add(us);
            }
        }

        @Override
        public void abortTransaction() {
            commitStarted = -1;
            super.abortTransaction();
        }
    }

    static final class Supplier extends DefaultKafkaClientSupplier {
        @Override
        public Producer<byte[], byte[]> getProducer(Map<String, Object> config) {
            return new TimedProducer(config);
        }
    }

    public static void main(String[] args) throws Exception {
        Map<String, String> a = new HashMap<>();
        for (int i = 0; i + 1 < args.length; i += 2) {
            if (!args[i].startsWith("--")) {
                throw new IllegalArgumentException("expected --name value pairs, got " + args[i]);
            }
            a.put(args[i].substring(2), args[i + 1]);
        }
        String input = need(a, "input");
        String probe = need(a, "probe-input");
        String output = need(a, "output");

        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, need(a, "application-id"));
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, need(a, "bootstrap-servers"));
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG,
                a.getOrDefault("guarantee", StreamsConfig.EXACTLY_ONCE_V2));
        p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, need(a, "commit-interval-ms"));
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, a.getOrDefault("threads", "1"));
        p.put(StreamsConfig.STATE_DIR_CONFIG, need(a, "state-dir"));
        p.put(StreamsConfig.producerPrefix(ProducerConfig.LINGER_MS_CONFIG), need(a, "linger-ms"));
        p.put(StreamsConfig.producerPrefix(ProducerConfig.BATCH_SIZE_CONFIG), need(a, "batch-size"));

        StreamsBuilder builder = new StreamsBuilder();
        long stopAfter = Long.parseLong(a.getOrDefault("stop-after-records", "0"));
        AtomicLong taken = new AtomicLong();
        CountDownLatch enough = new CountDownLatch(1);
        String workload = a.getOrDefault("workload", "pass-through");
        if (workload.equals("window-count")) {
            Duration size = Duration.ofMillis(Long.parseLong(need(a, "window-ms")));
            builder.stream(input, Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
                    .peek((k, v) -> {
                        if (taken.incrementAndGet() == stopAfter) {
                            enough.countDown();
                        }
                    })
                    .groupByKey(Grouped.with(Serdes.ByteArray(), Serdes.ByteArray()))
                    .windowedBy(TimeWindows.ofSizeWithNoGrace(size))
                    .count()
                    .suppress(Suppressed.untilWindowCloses(Suppressed.BufferConfig.unbounded()))
                    .toStream()
                    .map((wk, n) -> KeyValue.pair(wk.key(), n))
                    .to(output, Produced.with(Serdes.ByteArray(), Serdes.Long()));
        } else if (workload.equals("count-by-key")) {
            // Every update emitted, as onceflow's aggregate does: no record cache.
            p.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
            builder.stream(input, Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
                    .groupByKey(Grouped.with(Serdes.ByteArray(), Serdes.ByteArray()))
                    .count()
                    .toStream()
                    .to(output, Produced.with(Serdes.ByteArray(), Serdes.Long()));
        } else {
            // The bulk input and the latency probe's topic, each mapped to the output.
            for (String topic : List.of(input, probe)) {
                builder.stream(topic, Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
                        .mapValues(v -> v)
                        .to(output, Produced.with(Serdes.ByteArray(), Serdes.ByteArray()));
            }
        }

        KafkaStreams streams = new KafkaStreams(builder.build(), p, new Supplier());
        CountDownLatch done = new CountDownLatch(1);
        streams.setStateListener((now, before) -> {
            if (now == KafkaStreams.State.RUNNING) {
                System.out.println("onceflow-bench: running");
                System.out.flush();
            }
            if (now == KafkaStreams.State.ERROR) {
                System.err.println("onceflow-bench: Kafka Streams failed");
                done.countDown();
            }
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close(Duration.ofSeconds(60));
            StringBuilder json = new StringBuilder("{\"commits\":");
            synchronized (COMMITS_US) {
                json.append(COMMITS_US.size()).append(",\"commit_us\":[");
                for (int i = 0; i < COMMITS_US.size(); i++) {
                    json.append(i == 0 ? "" : ",").append(COMMITS_US.get(i));
                }
            }
            System.out.println(json.append("]}"));
            System.out.flush();
        }));
        streams.start();
        if (stopAfter > 0) {
            new Thread(() -> {
                try {
                    enough.await();
                    System.exit(0);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            }).start();
        }
        done.await();
        System.exit(1);
    }

    static String need(Map<String, String> a, String name) {
        String v = a.get(name);
        if (v == null) {
            throw new IllegalArgumentException("missing --" + name);
        }
        return v;
    }
}
