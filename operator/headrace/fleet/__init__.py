"""The brokers as both controllers reach them: the control loop's fleet and clock ports.

``http.HttpFleet`` polls every broker's heartbeat and pushes the topology over the
brokers' admin HTTP (the ``BrokerFleet`` port of ``headrace.control.looping``);
``clock.SystemClock`` is the ``Clock`` port on the machine's wall clock. The local
controller (``headrace.controller``) uses both as they are; the kopf operator
(``headrace.operator``) finds its brokers as pods and hands their endpoints to an
``HttpFleet`` (``headrace.operator.pods``).
"""
