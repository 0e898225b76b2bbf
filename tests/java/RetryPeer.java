// A Java consumer with the Java client's own retry letter topic (enableRetry), for the interop
// tests in tests/test_retry_java.py. Compiled in the test from the Apache Pulsar distribution's jars.
//
//   java RetryPeer <serviceUrl> <topic> <subscription> <maxRedeliverCount|0> <count> <ack|reconsume> <delayMs>
//
// Receives <count> messages (30 s each at most) on a Shared subscription with enableRetry(true)
// and, with a count > 0, a DeadLetterPolicy (initialSubscriptionName "dlq-reader"); prints one
// line per message, "@@" then JSON; then acks it or calls reconsumeLater(delayMs).
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.ConsumerBuilder;
import org.apache.pulsar.client.api.DeadLetterPolicy;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.apache.pulsar.client.api.SubscriptionType;

public class RetryPeer {
    static String quote(String s) {
        if (s == null) return "null";
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') b.append('\\').append(c);
            else if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
            else b.append(c);
        }
        return b.append('"').toString();
    }

    public static void main(String[] args) throws Exception {
        String url = args[0], topic = args[1], subscription = args[2];
        int max = Integer.parseInt(args[3]), count = Integer.parseInt(args[4]);
        String action = args[5];
        long delayMs = Long.parseLong(args[6]);
        try (PulsarClient client = PulsarClient.builder().serviceUrl(url).build()) {
            ConsumerBuilder<byte[]> builder = client.newConsumer().topic(topic).subscriptionName(subscription)
                .subscriptionType(SubscriptionType.Shared).enableRetry(true)
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest);
            if (max > 0) {
                builder.deadLetterPolicy(DeadLetterPolicy.builder().maxRedeliverCount(max)
                    .initialSubscriptionName("dlq-reader").build());
            }
            try (Consumer<byte[]> consumer = builder.subscribe()) {
                System.out.println("@@{\"ready\":true}");
                for (int i = 0; i < count; i++) {
                    Message<byte[]> m = consumer.receive(30, TimeUnit.SECONDS);
                    if (m == null) {
                        System.out.println("@@{\"timeout\":true}");
                        break;
                    }
                    long received = System.currentTimeMillis();
                    StringBuilder props = new StringBuilder("{");
                    for (Map.Entry<String, String> e : m.getProperties().entrySet()) {
                        if (props.length() > 1) props.append(',');
                        props.append(quote(e.getKey())).append(':').append(quote(e.getValue()));
                    }
                    props.append('}');
                    System.out.println("@@{\"data\":" + quote(new String(m.getData())) + ",\"topic\":" + quote(m.getTopicName())
                        + ",\"key\":" + quote(m.getKey()) + ",\"event_time\":" + m.getEventTime()
                        + ",\"publish_time\":" + m.getPublishTime() + ",\"received\":" + received
                        + ",\"message_id\":" + quote(m.getMessageId().toString()) + ",\"properties\":" + props + "}");
                    if (action.equals("reconsume")) {
                        consumer.reconsumeLater(m, delayMs, TimeUnit.MILLISECONDS);
                    } else {
                        consumer.acknowledge(m);
                    }
                }
            }
        }
    }
}
