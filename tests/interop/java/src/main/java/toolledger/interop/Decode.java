package toolledger.interop;

import java.io.File;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.message.BinaryMessageDecoder;
import org.apache.avro.message.SchemaStore;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * Reads every record of the ledger's topics as docs/consuming.md says, with nothing but the
 * published bundles (schemas/avro/bundle/v*.avsc) and the records' headers, and prints one line
 * per topic and event type: {@code count <topic> <ce_type> <events>}, where events are counted
 * once per ce_source + ce_id (copies of one event, such as a switch sent to every partition,
 * count once). Dead letters are counted per record: {@code count dead-letters <original topic>
 * <records>}; a record on the intents topic with no CloudEvents header at all is not the
 * ledger's: {@code count foreign intents <records>}. Any other record that does not decode, or whose headers disagree with its value, is a
 * line {@code error ...} and the exit status is 1.
 *
 * <p>Usage: Decode BOOTSTRAP TOPIC_PREFIX BUNDLE_DIR
 */
public final class Decode {
  private static final String FORMAT_SINGLE_OBJECT = "format=single-object";
  private static final String[] REQUIRED = {
    "ce_specversion", "ce_id", "ce_source", "ce_type", "ce_subject", "content-type"
  };

  public static void main(String[] args) throws Exception {
    String bootstrap = args[0];
    String prefix = args[1];
    File bundles = new File(args[2]);

    // Every committed version's schemas: the writer is found by the fingerprint in the
    // single-object header; the newest version of a record is the reader schema.
    SchemaStore.Cache writers = new SchemaStore.Cache();
    Map<String, Schema> readers = new HashMap<>();
    File[] files = bundles.listFiles((dir, name) -> name.matches("v\\d+\\.avsc"));
    if (files == null || files.length == 0) {
      throw new IllegalStateException("no bundle v<N>.avsc in " + bundles);
    }
    java.util.Arrays.sort(files, (a, b) -> Integer.compare(version(a), version(b)));
    for (File file : files) {
      Schema union = new Schema.Parser().parse(file); // one parser per version: names repeat
      for (Schema type : union.getTypes()) {
        if (type.getType() == Schema.Type.RECORD) {
          writers.addSchema(type);
          readers.put(type.getFullName(), type); // later versions replace earlier ones
        }
      }
    }
    Map<String, BinaryMessageDecoder<GenericRecord>> decoders = new HashMap<>();

    Properties props = new Properties();
    props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
    props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
    props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
    props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);

    Map<String, Integer> counts = new TreeMap<>();
    Set<String> seen = new HashSet<>();
    List<String> errors = new ArrayList<>();
    String[] topics = {"intents", "outcomes", "groups", "dead-letters"};
    try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
      List<TopicPartition> partitions = new ArrayList<>();
      for (String topic : topics) {
        for (PartitionInfo info : consumer.partitionsFor(prefix + topic)) {
          partitions.add(new TopicPartition(info.topic(), info.partition()));
        }
      }
      consumer.assign(partitions);
      consumer.seekToBeginning(partitions);
      Map<TopicPartition, Long> end = consumer.endOffsets(partitions);
      long deadline = System.currentTimeMillis() + 120_000;
      while (!reached(consumer, end)) {
        if (System.currentTimeMillis() > deadline) {
          throw new IllegalStateException("did not reach the end of the topics in 120 s");
        }
        for (ConsumerRecord<byte[], byte[]> record : consumer.poll(Duration.ofMillis(500))) {
          String topic = record.topic().substring(prefix.length());
          Map<String, String> headers = headers(record);
          String where = topic + "/" + record.partition() + "@" + record.offset();
          if (topic.equals("dead-letters")) {
            String from = headers.get("__connect.errors.topic");
            if (from == null || headers.get("__connect.errors.exception.message") == null) {
              errors.add("error " + where + ": a dead letter without __connect.errors headers");
              continue;
            }
            counts.merge("dead-letters " + from.substring(prefix.length()), 1, Integer::sum);
            continue;
          }
          if (!headers.containsKey("ce_specversion") && topic.equals("intents")) {
            // anyone may write to the intents topic: the executor dead-letters what is not an
            // event of the ledger; it is counted with the dead letters, not here
            counts.merge("foreign " + topic, 1, Integer::sum);
            continue;
          }
          String missing = missing(headers);
          if (missing != null) {
            errors.add("error " + where + ": no " + missing + " header");
            continue;
          }
          String type = headers.get("ce_type");
          String contentType = headers.get("content-type");
          if (topic.equals("groups")) {
            String shortName = type.substring(type.lastIndexOf('.') + 1);
            String json = new String(record.value(), StandardCharsets.UTF_8);
            if (!contentType.equals("application/json")
                || !json.contains("\"type\":\"" + shortName + "\"")) {
              errors.add("error " + where + ": " + type + " is not what the JSON value says");
              continue;
            }
          } else {
            if (!contentType.startsWith("application/avro")
                || !contentType.contains(FORMAT_SINGLE_OBJECT)
                || !contentType.contains("schema=" + type)) {
              errors.add("error " + where + ": unexpected content-type " + contentType);
              continue;
            }
            Schema reader = readers.get(type);
            if (reader == null) {
              errors.add("error " + where + ": no published schema named " + type);
              continue;
            }
            BinaryMessageDecoder<GenericRecord> decoder =
                decoders.computeIfAbsent(
                    type, t -> new BinaryMessageDecoder<>(GenericData.get(), reader, writers));
            GenericRecord event;
            try {
              event = decoder.decode(record.value());
            } catch (Exception exc) {
              errors.add("error " + where + ": " + exc);
              continue;
            }
            GenericRecord envelope = (GenericRecord) event.get("envelope");
            if (!envelope.get("event_id").toString().equals(headers.get("ce_id"))) {
              errors.add("error " + where + ": ce_id is not the envelope's event_id");
              continue;
            }
          }
          if (seen.add(topic + " " + headers.get("ce_source") + " " + headers.get("ce_id"))) {
            counts.merge(topic + " " + type, 1, Integer::sum);
          }
        }
      }
    }
    for (Map.Entry<String, Integer> entry : counts.entrySet()) {
      System.out.println("count " + entry.getKey() + " " + entry.getValue());
    }
    for (String error : errors) {
      System.out.println(error);
    }
    System.exit(errors.isEmpty() ? 0 : 1);
  }

  private static int version(File file) {
    return Integer.parseInt(file.getName().replaceAll("\\D", ""));
  }

  private static boolean reached(
      KafkaConsumer<byte[], byte[]> consumer, Map<TopicPartition, Long> end) {
    for (Map.Entry<TopicPartition, Long> entry : end.entrySet()) {
      if (consumer.position(entry.getKey()) < entry.getValue()) {
        return false;
      }
    }
    return true;
  }

  private static Map<String, String> headers(ConsumerRecord<byte[], byte[]> record) {
    Map<String, String> out = new HashMap<>();
    for (Header header : record.headers()) {
      out.put(header.key(), new String(header.value(), StandardCharsets.UTF_8));
    }
    return out;
  }

  private static String missing(Map<String, String> headers) {
    for (String name : REQUIRED) {
      if (!headers.containsKey(name)) {
        return name;
      }
    }
    return headers.get("ce_specversion").equals("1.0") ? null : "ce_specversion 1.0";
  }
}
