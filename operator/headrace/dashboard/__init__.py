"""The live dashboard: one implementation for every controller (local and kopf operator).

``views`` (pure) turns the controller's documents and the brokers' heartbeats into
the JSON view model the page renders; ``rates`` (pure) keeps the produce/consume
rates and lag of the last minutes in a bounded ring buffer, sampled from
heartbeats; ``observing.Observer`` is what a controller keeps between steps and
asks for the view; ``assets`` reads the page itself (HTML, CSS, JavaScript, shipped as
package data: nothing is fetched from outside the cluster). Both controllers serve
them through one thin HTTP route (``routes.DashboardRoutes``, aiohttp).
"""
