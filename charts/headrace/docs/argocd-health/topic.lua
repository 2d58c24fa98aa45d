-- Argo CD health of a headrace.dev Topic (resource.customizations.health.headrace.dev_Topic).
-- Ready=True: Healthy. Stalled=True (the spec cannot be carried out), or Ready=False
-- with a reason no waiting can fix (those, or data is unavailable): Degraded. Anything
-- else is still on its way.
local hs = {status = "Progressing", message = "Waiting for the operator to reconcile"}
local degraded = {
  InvalidSpec = true, UnknownCluster = true, ClusterNotFound = true, NotEnoughBrokers = true,
  ReplicasChange = true, DuplicateSpec = true,
  CompactionUnsupported = true, PartitionsOffline = true, BelowMinInSync = true,
}
if obj.status == nil or obj.status.conditions == nil then
  return hs
end
if obj.status.observedGeneration ~= nil and obj.metadata.generation ~= nil
    and obj.status.observedGeneration < obj.metadata.generation then
  hs.message = "Waiting for the operator to observe generation " .. obj.metadata.generation
  return hs
end
for _, c in ipairs(obj.status.conditions) do
  if c.type == "Stalled" and c.status == "True" then
    hs.status = "Degraded"
    hs.message = (c.reason or "") .. ": " .. (c.message or "")
    return hs
  end
end
for _, c in ipairs(obj.status.conditions) do
  if c.type == "Ready" then
    hs.message = (c.reason or "") .. ": " .. (c.message or "")
    if c.status == "True" then
      hs.status = "Healthy"
    elseif c.status == "False" and degraded[c.reason] then
      hs.status = "Degraded"
    end
    return hs
  end
end
return hs
