"""Topic and cohort administration over the data port: create, delete and describe topics,
describe cohorts, reset cursors."""

from __future__ import annotations

from headrace.broker.ports import FrameLink, Routes
from headrace.errors import MalformedFrame
from headrace.protocol import messages as msg
from headrace.protocol.frames import Frame, Op
from headrace.security.acl import Operation


class TopicAdmin:
    def __init__(self, conn: FrameLink) -> None:
        self.conn = conn

    def routes(self) -> Routes:
        return {
            Op.CREATE_TOPIC: self.on_create_topic,
            Op.DELETE_TOPIC: self.on_delete_topic,
            Op.DESCRIBE_TOPICS: self.on_describe_topics,
            Op.DESCRIBE_COHORTS: self.on_describe_cohorts,
            Op.RESET_CURSORS: self.on_reset_cursors,
        }

    def on_create_topic(self, frame: Frame) -> None:
        req = msg.CreateTopic.decode(frame.body)
        self.conn.access.require(Operation.ADMIN, req.name)
        topic = self.conn.broker.create_topic(req.name, req.partitions, req.config)
        self.conn.respond(
            frame, Op.CREATE_TOPIC_OK, msg.encode_json(self.conn.broker.describe_topic(topic.name))
        )

    def on_delete_topic(self, frame: Frame) -> None:
        req = msg.TopicName.decode(frame.body)
        self.conn.access.require(Operation.ADMIN, req.name)
        self.conn.broker.delete_topic(req.name)
        self.conn.respond(frame, Op.DELETE_TOPIC_OK, b"{}")

    def on_describe_topics(self, frame: Frame) -> None:
        obj = msg.decode_json(frame.body) if frame.body else {}
        name = obj.get("name")
        if name is not None:
            if not isinstance(name, str):
                raise MalformedFrame("field 'name' must be a string")
            topics = [self.conn.broker.describe_topic(name)]
        else:
            topics = [
                self.conn.broker.describe_topic(n) for n in sorted(self.conn.broker.registry.topics)
            ]
        self.conn.respond(frame, Op.DESCRIBE_TOPICS_OK, msg.encode_json({"topics": topics}))

    # ------------------------------------------------------------------ cohort admin

    def on_describe_cohorts(self, frame: Frame) -> None:
        request = msg.DescribeCohorts.decode(frame.body)
        answer = self.conn.broker.describe_cohorts(request)
        if self.conn.access.principal is not None:
            # Only the cohorts of topics this principal may consume or administer.
            answer["cohorts"] = [
                c for c in answer["cohorts"] if self.conn.access.may_see(c["topic"])
            ]
        self.conn.respond(frame, Op.DESCRIBE_COHORTS_OK, msg.encode_json(answer))

    def on_reset_cursors(self, frame: Frame) -> None:
        request = msg.ResetCursors.decode(frame.body)
        self.conn.access.require(Operation.ADMIN, request.topic)
        answer = self.conn.broker.reset_cursors(request)
        self.conn.respond(frame, Op.RESET_CURSORS_OK, msg.encode_json(answer))
