"""The Kubernetes deployer: variants as Deployments + Services in one namespace, traffic split by replica ratio or by a
Gateway API HTTPRoute.

    deployer.py   `KubernetesDeployer` and `KubernetesConfig`, the `Deployer` protocol over the API
    api.py        the API calls (the chart's Role is exactly these), retries, error translation
    manifests.py  the objects as plain dicts, no API calls
    status.py     what the objects say of a variant and its pods, no API calls
    crds/         httproute.yaml: the HTTPRoute CRD subset SITS writes, for clusters (and tests) without Gateway API
"""
