"""The refresher: a user's new events change what they are served within seconds, between
retrains (``rankstream refresh``). See :mod:`pipeline.refresh.refresher`."""
