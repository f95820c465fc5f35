"""`devplugin scheduler`: the control-plane service (scheduler extender and admission webhooks).

Plain functions over a state object do the work (`fit`, `extender`, `admission`); `http` is a thin Starlette
layer over them; `informer` and `cluster` are the apiserver side; `service` wires them and runs uvicorn.
"""
