import java.util.Properties;
import java.util.concurrent.Future;
import java.util.ArrayList;
import java.util.List;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.StringSerializer;

public class DefaultProducer {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        props.put("key.serializer", StringSerializer.class.getName());
        props.put("value.serializer", StringSerializer.class.getName());
        int count = Integer.parseInt(args[2]);
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
            List<Future<RecordMetadata>> sent = new ArrayList<>();
            for (int i = 0; i < count; i++) sent.add(producer.send(new ProducerRecord<>(args[1], "k" + (i % 7), "v" + i)));
            for (int i = 0; i < count; i++) { RecordMetadata m = sent.get(i).get(); System.out.println(i + " " + m.partition() + " " + m.offset()); }
        }
    }
}
