"""From a team's catalog and behaviour logs to a trained generative retriever: the logs
(``logs``), fine-tuning (``xgr train``) and offline evaluation (``xgr evaluate``)."""
