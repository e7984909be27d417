"""The web console, ``broker console``: a Starlette app with server-rendered pages (Jinja2) and htmx.

Pages: overview (rates, lag, workers, memory), subscriptions and their queues, the topic
tree, the dead-letter queue (browse, replay, purge: each confirmed), workers and channels;
live refresh every few seconds; charts of the last hour; a page per subscription (get
messages, purge, delete), the publish form and ``/manage`` (subscribe, link, topic objects,
definitions, users and grants), each on the API. Logins are the Redis ACL users of ``broker acl add NAME
--role monitor|admin``: ``monitor`` sees, ``admin`` acts. See docs/operations.md.

The management HTTP API under ``/api/`` (JSON, the same logins: basic auth or the session
with its CSRF token) is mounted in the same app. Modules: ``app`` (the app factory
``create_app``), ``auth`` (logins and sessions), ``figures`` (what the pages show), ``dlq``
(the dead-letter pages), ``api`` (the management API), ``openapi`` (its OpenAPI document),
``manage`` (the managing pages on the API), ``samples`` (the charts' ring). Static files
(``static/``: htmx and uPlot with their licences, ``console.js``, the stylesheets, the favicon)
and templates ship in the package.
"""

from broker.operations.console.app import create_app

__all__ = ["create_app"]
