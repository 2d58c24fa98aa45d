// franzgo: franz-go (github.com/twmb/franz-go) against a Kafka listener, driven by
// tests/integration/kafka/test_kafka_peers.py. It produces keyed records with acks=all
// (franz-go's default: idempotent), then consumes them in a consumer group and commits,
// printing one JSON line per event on stdout for the test to check.
//
//	franzgo produce BOOTSTRAP TOPIC COUNT
//	franzgo consume BOOTSTRAP TOPIC GROUP COUNT
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

type event struct {
	Event     string `json:"event"`
	Key       string `json:"key,omitempty"`
	Value     string `json:"value,omitempty"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
}

func emit(e event) {
	line, err := json.Marshal(e)
	if err != nil {
		panic(err)
	}
	fmt.Println(string(line))
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "franzgo: "+format+"\n", args...)
	os.Exit(1)
}

func produce(bootstrap, topic string, count int) {
	client, err := kgo.NewClient(
		kgo.SeedBrokers(bootstrap),
		kgo.DefaultProduceTopic(topic),
		kgo.RequiredAcks(kgo.AllISRAcks()),
	)
	if err != nil {
		fail("client: %v", err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	records := make([]*kgo.Record, count)
	for i := range records {
		records[i] = &kgo.Record{Key: []byte(fmt.Sprintf("k%d", i%7)), Value: []byte(fmt.Sprintf("v%d", i))}
	}
	// ProduceSync keeps the order of the slice; one key's records go to one partition in order
	for _, result := range client.ProduceSync(ctx, records...) {
		if result.Err != nil {
			fail("produce: %v", result.Err)
		}
		r := result.Record
		emit(event{Event: "produced", Key: string(r.Key), Value: string(r.Value), Partition: r.Partition, Offset: r.Offset})
	}
}

func consume(bootstrap, topic, group string, count int) {
	client, err := kgo.NewClient(
		kgo.SeedBrokers(bootstrap),
		kgo.ConsumeTopics(topic),
		kgo.ConsumerGroup(group),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
	)
	if err != nil {
		fail("client: %v", err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	seen := 0
	for seen < count {
		fetches := client.PollFetches(ctx)
		if ctx.Err() != nil {
			fail("consume: %d of %d records before the deadline", seen, count)
		}
		fetches.EachError(func(t string, p int32, err error) { fail("fetch %s/%d: %v", t, p, err) })
		fetches.EachRecord(func(r *kgo.Record) {
			seen++
			emit(event{Event: "consumed", Key: string(r.Key), Value: string(r.Value), Partition: r.Partition, Offset: r.Offset})
		})
		if err := client.CommitUncommittedOffsets(ctx); err != nil {
			fail("commit: %v", err)
		}
	}
	emit(event{Event: "committed"})
	// Leave the group cleanly, so that the next member (or the test) finds it empty
	client.LeaveGroup()
}

func main() {
	if len(os.Args) < 2 {
		fail("usage: franzgo produce|consume ...")
	}
	number := func(s string) int {
		n, err := strconv.Atoi(s)
		if err != nil {
			fail("not a number: %q", s)
		}
		return n
	}
	switch {
	case os.Args[1] == "produce" && len(os.Args) == 5:
		produce(os.Args[2], os.Args[3], number(os.Args[4]))
	case os.Args[1] == "consume" && len(os.Args) == 6:
		consume(os.Args[2], os.Args[3], os.Args[4], number(os.Args[5]))
	default:
		fail("usage: franzgo produce BOOTSTRAP TOPIC COUNT | consume BOOTSTRAP TOPIC GROUP COUNT")
	}
}
