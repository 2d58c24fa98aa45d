import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ListConsumerGroupOffsetsSpec;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.logging.log4j.Level;
import org.apache.logging.log4j.LogManager;
import org.apache.logging.log4j.core.LoggerContext;
import org.apache.logging.log4j.core.config.LoggerConfig;

/** Kafka's admin client listing the committed offsets of several groups in one call (which it
 *  sends as one OffsetFetch request when the broker serves v8+). Prints "group topic partition
 *  offset" lines; the requests it sends are logged (NetworkClient at debug) on stderr. */
public class GroupOffsets {
    public static void main(String[] args) throws Exception {
        // the context of Kafka's class loader: a source file runs in a loader of its own
        LoggerContext logs = (LoggerContext) LogManager.getContext(Admin.class.getClassLoader(), false);
        String network = "org.apache.kafka.clients.NetworkClient";
        logs.getConfiguration().addLogger(network, new LoggerConfig(network, Level.DEBUG, true));
        logs.updateLoggers();
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        Map<String, ListConsumerGroupOffsetsSpec> specs = new HashMap<>();
        for (int i = 1; i < args.length; i++) specs.put(args[i], new ListConsumerGroupOffsetsSpec());
        try (Admin admin = Admin.create(props)) {
            Map<String, Map<TopicPartition, OffsetAndMetadata>> all =
                admin.listConsumerGroupOffsets(specs).all().get();
            for (var group : all.entrySet())
                for (var entry : group.getValue().entrySet())
                    System.out.println(group.getKey() + " " + entry.getKey().topic() + " "
                        + entry.getKey().partition() + " " + entry.getValue().offset());
        }
    }
}
