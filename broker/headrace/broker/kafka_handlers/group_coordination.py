"""The consumer-group APIs over ``kafka_groups.KafkaGroups``: FindCoordinator, JoinGroup,
SyncGroup, Heartbeat, LeaveGroup, ListGroups, DescribeGroups and DeleteGroups.

Each first asks whether this broker coordinates the group (``owner_error``); a join
and a sync wait for the rebalance, so they answer later."""

from __future__ import annotations

from typing import TYPE_CHECKING

from headrace.broker.kafka_handlers.context import (
    KafkaHandlers,
    KafkaRequestContext,
    KafkaRoutes,
)
from headrace.errors import HeadraceError
from headrace.kafka import groups
from headrace.kafka import messages as km
from headrace.kafka.errors import ErrorCode
from headrace.protocol.endpoints import KafkaAddress

if TYPE_CHECKING:
    from headrace.broker.kafka_groups import KafkaGroups


class GroupCoordination(KafkaHandlers):
    def __init__(self, context: KafkaRequestContext, coordinator: KafkaGroups) -> None:
        super().__init__(context)
        self.peer = context.peer
        self.advertised = context.advertised
        self.groups = coordinator

    def routes(self) -> KafkaRoutes:
        return {
            km.ApiKey.FIND_COORDINATOR: self.find_coordinator,
            km.ApiKey.JOIN_GROUP: self.join_group,
            km.ApiKey.SYNC_GROUP: self.sync_group,
            km.ApiKey.HEARTBEAT: self.heartbeat,
            km.ApiKey.LEAVE_GROUP: self.leave_group,
            km.ApiKey.LIST_GROUPS: self.list_groups,
            km.ApiKey.DESCRIBE_GROUPS: self.describe_groups,
            km.ApiKey.DELETE_GROUPS: self.delete_groups,
        }

    def find_coordinator(
        self, header: km.RequestHeader, req: km.FindCoordinatorRequest
    ) -> km.FindCoordinatorResponse:
        if req.key_type != 0:
            # Transactions are not served. A retriable COORDINATOR_NOT_AVAILABLE would keep a
            # transactional producer asking until its own timeout; this is the answer every
            # client treats as fatal (Kafka's, for an id the principal may not use).
            return km.FindCoordinatorResponse(
                0,
                ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                "transactions are not supported",
                -1,
            )
        mine = (self.broker.settings.broker_id, KafkaAddress(*self.advertised()))
        found, why, node, address = self.groups.find(req.key, mine)
        if address is None:
            return km.FindCoordinatorResponse(0, found, why, -1)
        return km.FindCoordinatorResponse(0, found, why, node, address.host, address.port)

    async def join_group(
        self, header: km.RequestHeader, req: km.JoinGroupRequest
    ) -> km.JoinGroupResponse:
        owner = self.groups.owner_error(req.group_id)
        if owner != ErrorCode.NONE:
            return km.JoinGroupResponse(0, owner, -1, "", "", req.member_id, [])
        ask = groups.JoinAsk(
            req.group_id,
            req.member_id,
            header.client_id or "",
            self.peer.rpartition(":")[0],
            req.session_timeout_ms,
            # v0 has no rebalance timeout: Kafka takes the session timeout
            req.rebalance_timeout_ms if req.rebalance_timeout_ms >= 0 else req.session_timeout_ms,
            req.protocol_type,
            tuple((p.name, p.metadata) for p in req.protocols),
            req.group_instance_id,
        )
        answer = await self.groups.join(ask)
        # the leader's roster names static members' instance ids (assignors order by them)
        group = self.groups.core.groups.get(req.group_id)
        known = group.members if group is not None else {}
        members = [
            km.JoinGroupResponseMember(m, known[m].instance_id if m in known else None, meta)
            for m, meta in answer.members
        ]
        return km.JoinGroupResponse(
            0,
            answer.error,
            answer.generation,
            answer.protocol_name,
            answer.leader,
            answer.member_id,
            members,
        )

    async def sync_group(
        self, header: km.RequestHeader, req: km.SyncGroupRequest
    ) -> km.SyncGroupResponse:
        owner = self.groups.owner_error(req.group_id)
        if owner != ErrorCode.NONE:
            return km.SyncGroupResponse(0, owner, b"")
        assignments = {a.member_id: a.assignment for a in req.assignments}
        answer = await self.groups.sync(
            req.group_id, req.generation_id, req.member_id, assignments, req.group_instance_id
        )
        return km.SyncGroupResponse(0, answer.error, answer.assignment)

    def heartbeat(self, header: km.RequestHeader, req: km.HeartbeatRequest) -> km.HeartbeatResponse:
        code: int = self.groups.owner_error(req.group_id)
        if code == ErrorCode.NONE:
            code = self.groups.heartbeat(
                req.group_id, req.generation_id, req.member_id, req.group_instance_id
            )
        return km.HeartbeatResponse(0, code)

    def leave_group(
        self, header: km.RequestHeader, req: km.LeaveGroupRequest
    ) -> km.LeaveGroupResponse:
        code: int = self.groups.owner_error(req.group_id)
        if header.api_version < 3:
            if code == ErrorCode.NONE:
                code = self.groups.leave(req.group_id, req.member_id)
            return km.LeaveGroupResponse(0, code)
        if code != ErrorCode.NONE:
            return km.LeaveGroupResponse(0, code)
        # v3+: several members, each by its member id or its instance id (KIP-345)
        left = [
            km.LeaveGroupMemberResponse(
                m.member_id,
                m.group_instance_id,
                self.groups.leave(req.group_id, m.member_id, m.group_instance_id),
            )
            for m in req.members
        ]
        return km.LeaveGroupResponse(0, ErrorCode.NONE, left)

    def list_groups(
        self, header: km.RequestHeader, req: km.ListGroupsRequest
    ) -> km.ListGroupsResponse:
        listed = [km.ListedGroup(group, kind) for group, kind in self.groups.listed()]
        return km.ListGroupsResponse(0, ErrorCode.NONE, listed)

    def describe_groups(
        self, header: km.RequestHeader, req: km.DescribeGroupsRequest
    ) -> km.DescribeGroupsResponse:
        return km.DescribeGroupsResponse(0, [self._describe(g) for g in req.groups])

    def _describe(self, group_id: str) -> km.DescribedGroup:
        owner = self.groups.owner_error(group_id)
        if owner != ErrorCode.NONE:
            return km.DescribedGroup(owner, group_id, "", "", "", [])
        group = self.groups.core.groups.get(group_id)
        if group is None:
            return km.DescribedGroup(ErrorCode.NONE, group_id, "Dead", "", "", [])
        members = [
            km.DescribedGroupMember(
                m.member_id,
                m.instance_id,
                m.client_id,
                m.client_host,
                m.metadata_for(group.protocol_name) if group.protocol_name else b"",
                m.assignment,
            )
            for m in group.members.values()
        ]
        return km.DescribedGroup(
            ErrorCode.NONE,
            group_id,
            group.state.value,
            group.protocol_type,
            group.protocol_name,
            members,
        )

    async def delete_groups(
        self, header: km.RequestHeader, req: km.DeleteGroupsRequest
    ) -> km.DeleteGroupsResponse:
        results = []
        for group_id in req.groups_names:
            code: int = self.groups.owner_error(group_id)
            if code == ErrorCode.NONE:
                code = self._may_delete_group(group_id)
            if code == ErrorCode.NONE:
                code = await self.groups.delete(group_id)
            results.append(km.DeletableGroupResult(group_id, code))
        return km.DeleteGroupsResponse(0, results)

    def _may_delete_group(self, group_id: str) -> int:
        """Deleting a group forgets its committed offsets: it needs what committing them
        needs, on every topic it has offsets for."""
        for topic in sorted({t for t, _ in self.groups.core.committed(group_id)}):
            try:
                self.access.require_cohort(topic, group_id)
            except HeadraceError:
                return ErrorCode.GROUP_AUTHORIZATION_FAILED
        return ErrorCode.NONE
