"""Deployment infrastructure: the deployment registry, `cascade deploy`, Prefect and cluster configuration."""
