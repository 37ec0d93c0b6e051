"""An export as a model version of its run's MLflow run, carrying its signature bundle.

``recovery export`` (and the ``dvc repro`` export stage) with ``trackers.mlflow``
enabled logs the inference artifact's files (``model.sig``, the DSSE bundle over
all of them, included) to the MLflow run its journal names, under
``exports/<dir>-step-<N>``, and registers that directory as a version of
``trackers.mlflow.registered_model`` (default: the run name), tagged with its
lineage: digest, signer, purpose, step, and the checkpoint it was made from. The
artifact is verified first: only what a trusted key signed is registered.
"""

from __future__ import annotations

from pathlib import Path

from recovery.format.layout import METRICS_FILE
from recovery.integrity.keys.signing import TrustStore
from recovery.run.trackers.config import MlflowConfig
from recovery.run.trackers.mlflow import RUN_TAG, client_for, experiment, find_run


def register_export(
    cfg: MlflowConfig, out: Path, *, run_dir: Path, trust: TrustStore, run_name: str
) -> str:
    """Log the export at ``out`` (its files, ``model.sig`` included) to its run's MLflow
    run and register it as a version of ``cfg.registered_model`` (default: ``run_name``),
    tagged with its lineage; return the version.

    Raises:
        VerificationError: ``out`` is not an artifact signed by a key of ``trust``.
        Exception: whatever the MLflow client raises (the caller warns).
    """
    from recovery.integrity.reads.reader import read_manifest

    mf = read_manifest(out, trust)
    rec = mf.recovery
    source = (rec.get("export") or {}).get("source") or {}
    run_id = str(rec.get("run_id"))
    client = client_for(cfg)
    mlflow_run_id = find_run(client, cfg, run_dir / METRICS_FILE, run_id)
    if mlflow_run_id is None:
        exp = experiment(client, cfg.experiment)
        mlflow_run_id = str(
            client.create_run(exp, run_name=run_name, tags={RUN_TAG: run_id}).info.run_id
        )
    where = f"exports/{out.name}-step-{mf.step}"
    client.log_artifacts(mlflow_run_id, str(out), where)
    lineage = {
        "recovery.sha256": mf.root,
        "recovery.signer": mf.signer.key_id if mf.signer is not None else "",
        "recovery.purpose": mf.purpose,
        "recovery.step": str(mf.step),
        "recovery.parent": str(source.get("name")),
        "recovery.parent.sha256": str(source.get("sha256")),
        "recovery.signature": f"{where}/model.sig",
    }
    client.log_dict(mlflow_run_id, lineage, f"{where}.lineage.json")
    model = cfg.registered_model or run_name
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(model)
    except MlflowException as err:
        if "RESOURCE_ALREADY_EXISTS" not in str(err.error_code):
            raise
    version = client.create_model_version(
        model, f"runs:/{mlflow_run_id}/{where}", run_id=mlflow_run_id, tags=lineage
    )
    return str(version.version)
