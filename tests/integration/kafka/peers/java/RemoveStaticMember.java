import java.util.List;
import java.util.Properties;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.MemberDescription;
import org.apache.kafka.clients.admin.MemberToRemove;
import org.apache.kafka.clients.admin.RemoveMembersFromConsumerGroupOptions;

/** Kafka's admin client describing a classic group's members ("member <id> <instance id>"),
 *  then removing a static member by its instance id (LeaveGroup v3+) and printing
 *  "removed <instance id>". Arguments: bootstrap servers, group, instance id. */
public class RemoveStaticMember {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        try (Admin admin = Admin.create(props)) {
            ConsumerGroupDescription group =
                admin.describeConsumerGroups(List.of(args[1])).describedGroups().get(args[1]).get();
            for (MemberDescription m : group.members())
                System.out.println("member " + m.consumerId() + " " + m.groupInstanceId().orElse("-"));
            var options = new RemoveMembersFromConsumerGroupOptions(List.of(new MemberToRemove(args[2])));
            admin.removeMembersFromConsumerGroup(args[1], options).all().get();
            System.out.println("removed " + args[2]);
        }
    }
}
