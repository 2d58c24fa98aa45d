-- Argo CD health of a headrace.dev BrokerCluster (resource.customizations.health.headrace.dev_BrokerCluster).
-- Paused=True: Suspended. Ready=True (every broker live): Healthy. Stalled=True (a spec
-- the operator refuses, e.g. a scale-down that would drop replicas), or the reason of one
-- on an older operator: Degraded. Brokers not live yet (a rollout, a restart): Progressing.
local hs = {status = "Progressing", message = "Waiting for the operator to reconcile"}
local degraded = {ScaleDownBlocked = true}
if obj.status == nil or obj.status.conditions == nil then
  return hs
end
if obj.status.observedGeneration ~= nil and obj.metadata.generation ~= nil
    and obj.status.observedGeneration < obj.metadata.generation then
  hs.message = "Waiting for the operator to observe generation " .. obj.metadata.generation
  return hs
end
local ready = nil
local stalled = nil
for _, c in ipairs(obj.status.conditions) do
  if c.type == "Paused" and c.status == "True" then
    hs.status = "Suspended"
    hs.message = c.message or "Paused"
    return hs
  end
  if c.type == "Ready" then
    ready = c
  end
  if c.type == "Stalled" and c.status == "True" then
    stalled = c
  end
end
if stalled ~= nil then
  hs.status = "Degraded"
  hs.message = (stalled.reason or "") .. ": " .. (stalled.message or "")
elseif ready ~= nil then
  hs.message = (ready.reason or "") .. ": " .. (ready.message or "")
  if ready.status == "True" then
    hs.status = "Healthy"
  elseif ready.status == "False" and degraded[ready.reason] then
    hs.status = "Degraded"
  end
end
return hs
